"""A library model's options in a job request (`model_args`): the keys and values the API takes,
read as the CLI reads `--model-arg key=value`; the family's own parser checks them after."""

from __future__ import annotations

from typing import Annotated

from pydantic import BeforeValidator, Field

ModelArgKey = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[a-z_]+$")]


def _option_text(value: object) -> object:
    """A JSON number or boolean as the text `--model-arg` takes (`4`, `0.5`, `true`), trimmed as
    the CLI trims it: a client sends `{"batch": 4}` as readily as `{"batch": "4"}`, and the
    family's own parser then checks the value (a bare "valid string" error hid which key and
    what it allows). Anything else is left for the string check to refuse."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return value.strip() if isinstance(value, str) else value


_TEXT = Field(min_length=1, max_length=64, pattern=r"^[^\x00-\x1f\x7f]+$")
ModelArgValue = Annotated[
    str,
    # The schema says what a client may send (a generated client refused `{"batch": 64}`, the
    # README's own example, while the service took it: a new API client's trial).
    BeforeValidator(
        _option_text, json_schema_input_type=Annotated[str, _TEXT] | int | float | bool
    ),
    _TEXT,
]
