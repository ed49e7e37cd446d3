"""A recommendation in the formats a user takes away: JSON, environment lines, Python."""

from __future__ import annotations

import json
from typing import Any

from trainers import LoopConfig
from tuner.errors import NoRecommendation, TunerError
from tuner.evidence.recommendation import Recommendation

EXPORT_FORMATS = ("json", "env", "python")
ENV_PREFIX = "STREAMTUNE_"


def export(rec: Recommendation, fmt: str) -> str:
    """The recommended config as JSON, as environment lines, or as Python building it."""
    if fmt not in EXPORT_FORMATS:
        raise TunerError(f"--format: {fmt!r} is invalid: allowed {', '.join(EXPORT_FORMATS)}")
    if rec.config is None:
        raise NoRecommendation(f"study {rec.study!r}: {rec.reason}")
    config = LoopConfig.from_dict(rec.config)
    if fmt == "json":
        return json.dumps(config.to_dict(), indent=2)
    if fmt == "env":
        return "\n".join(
            f"{ENV_PREFIX}{k.upper()}={_env_value(v)}" for k, v in config.to_dict().items()
        )
    args = ",\n".join(f"    {k}={v!r}" for k, v in config.to_dict().items())
    return (
        f"# streamtune recommendation for study {rec.study!r} on {rec.hardware}\n"
        f"from trainers import LoopConfig\n\nconfig = LoopConfig(\n{args},\n)"
    )


def config_from_env(environ: dict[str, str]) -> LoopConfig:
    """The inverse of the `env` export: build a LoopConfig from STREAMTUNE_* variables."""
    values: dict[str, Any] = {}
    for field, default in LoopConfig().to_dict().items():
        raw = environ.get(f"{ENV_PREFIX}{field.upper()}")
        if raw is None:
            continue
        if isinstance(default, bool):
            values[field] = raw.lower() in ("1", "true", "yes")
        elif isinstance(default, int):
            values[field] = int(raw)
        else:
            values[field] = raw
    return LoopConfig(**values)


def _env_value(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
