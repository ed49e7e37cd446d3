"""A job's `space` and `fix`: one field per `trainers.LoopConfig` setting, from the lever table.

`space` is a built-in space's name or an object of settings; each setting of that object is one
value (fixed), a list of choices or an integer range. Which of those a value is follows from its
JSON type (a string or an object; one value, a list or an object), and only that reading is
checked: an error then names the field and what it allows, not each reading pydantic tried
(`{"num_streams": [9]}` had answered four errors, three of them about readings the client never
meant, with loc segments such as `list[constrained-int]`). Pydantic puts the readings' tags in an
error's `loc`, after `space` and after the setting; `without_tags` drops them there, and only there
(a client's own key may be any word: `{"num_streams": {"choices": [1, 2]}}`).
"""

from __future__ import annotations

import functools
import operator
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    Discriminator,
    Field,
    Tag,
    WithJsonSchema,
    create_model,
    field_validator,
)

from api.schemas.common import Strict
from trainers import LEVERS, Lever

BUILT_IN_SPACES = ("auto", "full", "streams", "compile", "scale")
CHOICES = 16
"""The most choices one setting of an explicit space may list."""
NAME, SETTINGS, VALUE, LIST, RANGE = "a name", "settings", "a value", "choices", "a range"


class IntRangeIn(Strict):
    """Integers low..high, both included; `log` samples on a log scale (low >= 1)."""

    low: int = Field(ge=0, le=10_000)
    high: int = Field(ge=0, le=10_000)
    log: bool = False


def _one_of(values: tuple[Any, ...]) -> Any:
    def check(value: Any) -> Any:
        # Not `Literal[1, 2, 4, 8]`: a Literal matches by equality, so JSON's `true` and `1.0`
        # would pass as 1 (True == 1 == 1.0), although no type is coerced. A strict number, then
        # the same enum.
        if value not in values or isinstance(value, bool):
            raise ValueError(f"one of {', '.join(map(str, values))}")
        return value

    return check


def _value_type(item: Lever) -> Any:
    """One value of `item`, as its declaration allows it (`trainers.levers`)."""
    if item.kind == "bool":
        return bool
    if item.span is not None:
        return Annotated[int, Field(ge=item.span.low, le=item.span.high)]
    values = item.values()
    if item.kind == "str":
        return Literal[values]
    base = int if item.kind == "int" else float
    return Annotated[
        base,
        AfterValidator(_one_of(values)),
        WithJsonSchema({"type": "integer" if base is int else "number", "enum": list(values)}),
    ]


def _reading(value: Any) -> str:
    """Which reading of a setting `value` is: a list of choices, a range, or one value."""
    if isinstance(value, list):
        return LIST
    return RANGE if isinstance(value, dict | IntRangeIn) else VALUE


def _setting(item: Lever, *, searched: bool) -> tuple[Any, Any]:
    """A field of `SpaceIn` (`searched`: a value, a list of choices, or an integer range) or of
    `FixIn` (a value), with the lever's label as its description."""
    one = _value_type(item)
    if not searched:
        return (one | None, Field(default=None, description=item.label))
    choices = Annotated[list[one], Field(min_length=1, max_length=CHOICES)]  # type: ignore[valid-type]
    readings: list[Any] = [Annotated[one, Tag(VALUE)], Annotated[choices, Tag(LIST)]]
    allowed = "one value or a list of choices"
    if item.span is not None:
        readings.append(Annotated[IntRangeIn, Tag(RANGE)])
        allowed = "one value, a list of choices or a range {low, high, log}"
    union: Any = functools.reduce(operator.or_, readings)
    kinds = Annotated[
        union,
        Discriminator(
            _reading, custom_error_type="setting_type", custom_error_message=f"allowed {allowed}"
        ),
    ]
    return (kinds | None, Field(default=None, description=item.label))


def lever_model(name: str, doc: str, *, searched: bool) -> type[Strict]:
    """A request model with one field per `LoopConfig` setting, in its order, from the lever
    table: a new lever or value is offered here without an edit."""
    fields: dict[str, Any] = {
        item.name: _setting(item, searched=searched) for item in LEVERS.values()
    }
    # An explicit null had been dropped with the unset settings: `"fix": {"sync_mode": null}`
    # was stored as no pin, with 201 (a probe, 2026-12-07).
    refuse_null = field_validator("*", mode="before")(_not_null)
    return create_model(
        name, __base__=Strict, __doc__=doc, __validators__={"not_null": refuse_null}, **fields
    )


def _not_null(cls: type, value: Any) -> Any:
    if value is None:
        raise ValueError("null is not a setting's value: leave the setting out for its default")
    return value


def _space_reading(value: Any) -> str | None:
    if isinstance(value, str):
        return NAME
    return SETTINGS if isinstance(value, dict | BaseModel) else None


def space_type(space_in: type[Strict]) -> Any:
    """The type of `JobIn.space`: a built-in space's name or `space_in`'s settings."""
    names = Literal[BUILT_IN_SPACES]  # type: ignore[valid-type]
    return Annotated[
        Annotated[names, Tag(NAME)] | Annotated[space_in, Tag(SETTINGS)],
        Discriminator(
            _space_reading,
            custom_error_type="space_type",
            custom_error_message=f"allowed {', '.join(map(repr, BUILT_IN_SPACES))} or an "
            "object of settings, each one value, a list of choices or a range {low, high}",
        ),
    ]


if TYPE_CHECKING:

    class SpaceIn(Strict): ...

    class FixIn(Strict): ...

    SpaceField = str | SpaceIn

else:
    SpaceIn = lever_model(
        "SpaceIn",
        "An explicit space: per setting a value (fixed), a list of choices or a range; the "
        "settings left out keep LoopConfig's defaults. At least one setting must be searched.",
        searched=True,
    )
    FixIn = lever_model("FixIn", "Settings pinned whatever the space says.", searched=False)
    SpaceField = space_type(SpaceIn)  # `JobIn.space`'s type


def without_tags(loc: tuple[Any, ...]) -> tuple[Any, ...]:
    """`loc` as the client named the field: without the tags pydantic put after `space` and
    after its setting (("body", "space", "settings", "num_streams", "choices", 0) becomes
    ("body", "space", "num_streams", 0)); any other loc as it is."""
    if loc[:2] != ("body", "space") or len(loc) < 3 or loc[2] not in (NAME, SETTINGS):
        return loc
    rest = loc[:2] + loc[3:]
    if len(rest) > 3 and rest[3] in (VALUE, LIST, RANGE):
        rest = rest[:3] + rest[4:]
    return rest
