"""Where a lever enters from outside: whether the API's job schema and the CLI's `--fix` take a
value (the lever tests hold the two to the same answer)."""

from __future__ import annotations

from pydantic import ValidationError

from api.schemas.jobs import job_model
from tuner.errors import SpaceError
from tuner.search.spaces.pins import parse_fix


def accepted(lever: str, value: str) -> tuple[bool, bool]:
    """(the API's job schema takes `lever=value` in `fix`, the CLI's `--fix` takes it)."""
    try:
        job_model().model_validate({"workload": "mlp", "preset": "tiny", "fix": {lever: value}})
        api = True
    except ValidationError:
        api = False
    try:
        parse_fix([f"{lever}={value}"])
        cli = True
    except SpaceError:
        cli = False
    return api, cli
