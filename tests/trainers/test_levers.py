"""The lever table (`trainers.levers`) against what `LoopConfig` accepts and what reads it: a value
declared without any of its facts, a field declared twice or not at all, or a table that says
other values than validation accepts fails here, not in a study."""

from __future__ import annotations

import dataclasses
import typing
from typing import get_args

import pytest

from trainers import COMPILE_MODES, OPTIMIZERS, SYNC_MODES, LoopConfig, field_names, invalid_reason
from trainers.compilation import COMPILE_WARMUP_STEPS, min_warmup_for_compile
from trainers.errors import ConfigError
from trainers.gate.parity import NUMERICS_FIELDS
from trainers.levers import (
    DECLARED,
    FIELD_LEVERS,
    LEVERS,
    TIE_ORDER,
    Cost,
    Lever,
    Numerics,
    Option,
    Value,
    defaults_where,
)

# Settings under which a value that needs another lever is valid: blocks compiled need a compile
# mode, a checkpoint share needs checkpointing, the DDP and FSDP2 settings need their wrapper.
_CONTEXTS: tuple[dict[str, Value], ...] = (
    {},
    {"compile": "default"},
    {"activation_checkpointing": "blocks"},
    {"parallel": "ddp"},
    {"parallel": "fsdp2"},
)


def _samples(lever: Lever) -> tuple[Value, ...]:
    """Every declared value, or for a span its ends, its default and a value inside."""
    if lever.span is None:
        return lever.values()
    span = lever.span
    high = span.high if span.high is not None else span.low + 1000
    return tuple(dict.fromkeys((span.low, span.low + 1, lever.default, high)))


def _outside(lever: Lever) -> tuple[object, ...]:
    """Values of the right type that the lever does not allow, and one of the wrong type."""
    if lever.kind == "bool":
        return ("yes", 1)
    if lever.kind == "str":
        return (f"not-a-{lever.name}", 1)
    if lever.span is not None:
        above = () if lever.span.high is None else (lever.span.high + 1,)
        return (lever.span.low - 1, *above, True)
    if lever.kind == "int":
        return (next(n for n in range(1, 100) if n not in lever.values()), True, "2")
    return (0.3, True, "0.5")


def _cases(make: typing.Callable[[Lever], tuple[object, ...]]) -> list[tuple[str, object]]:
    return [(lever.name, value) for lever in DECLARED for value in make(lever)]


def test_every_loop_config_field_is_declared_exactly_once_in_field_order() -> None:
    names = [lever.name for lever in DECLARED]
    assert len(names) == len(set(names))
    assert field_names() == tuple(LEVERS)
    # The fields first, in field order; a lever module's levers after them.
    assert field_names()[: len(names)] == tuple(names)
    # `modules` carries the lever modules' levers: no lever of the table's own.
    fields = [f.name for f in dataclasses.fields(LoopConfig)]
    assert fields == [*names, "modules"]


def test_each_default_is_the_loop_configs_and_is_free_exact_and_simplest() -> None:
    defaults = {f.name: f.default for f in dataclasses.fields(LoopConfig)}
    for lever in DECLARED:
        assert lever.default == defaults[lever.name], lever.name
        at_default = lever.option(lever.default)
        assert (at_default.cost, at_default.numerics, at_default.warmup_steps) == (
            "none",
            "exact",
            0,
        )
        assert at_default.rank == min(lever.rank(v) for v in _samples(lever)), lever.name


@pytest.mark.parametrize(("field", "value"), _cases(_samples))
def test_every_value_has_a_rank_a_cost_class_and_a_numerics_class(field: str, value: Value) -> None:
    option = LEVERS[field].option(value)
    assert option.value == value
    assert isinstance(option.rank, int) and option.rank >= 0
    assert option.cost in get_args(Cost)
    assert option.numerics in get_args(Numerics)
    assert isinstance(option.warmup_steps, int) and option.warmup_steps >= 0


def test_a_value_without_a_rank_cannot_be_declared() -> None:
    with pytest.raises(TypeError, match="rank"):
        Option(value="x", cost="none", numerics="exact", warmup_steps=0)  # type: ignore[call-arg]


def test_ranks_tell_every_declared_value_apart() -> None:
    for lever in DECLARED:
        ranks = [option.rank for option in lever.options]
        assert len(ranks) == len(set(ranks)), lever.name


def test_an_undeclared_value_has_no_facts() -> None:
    with pytest.raises(KeyError, match="compile='max-autotune'"):
        LEVERS["compile"].option("max-autotune")


@pytest.mark.parametrize(("field", "value"), _cases(_samples))
def test_loop_config_accepts_every_value_the_table_declares(field: str, value: Value) -> None:
    accepted = [c for c in _CONTEXTS if invalid_reason({**c, field: value}) is None]
    assert accepted, [invalid_reason({**c, field: value}) for c in _CONTEXTS]
    assert getattr(LoopConfig.from_dict({**accepted[0], field: value}), field) == value


@pytest.mark.parametrize(("field", "value"), _cases(_outside))
def test_loop_config_refuses_a_value_outside_the_table_naming_field_and_allowed(
    field: str, value: object
) -> None:
    allowed = LEVERS[field].allowed()
    reason = invalid_reason({field: value})
    assert reason is not None and reason.startswith(f"{field}=") and reason.endswith(allowed)
    with pytest.raises(ConfigError) as caught:
        LoopConfig.from_dict({field: value})
    assert (caught.value.field, caught.value.allowed) == (field, allowed)
    for declared in LEVERS[field].values():
        assert str(declared).lower() in allowed


def test_the_literal_types_say_what_the_table_says() -> None:
    # mypy and the API schema read the Literal types; the running code reads the table.
    hints = typing.get_type_hints(LoopConfig)
    for lever in DECLARED:
        if lever.kind == "str":
            assert get_args(hints[lever.name]) == lever.choices(), lever.name
    assert COMPILE_MODES == ("none", "default", "max-autotune-no-cudagraphs", "reduce-overhead")
    assert OPTIMIZERS == ("as-built", "foreach", "fused", "compiled")
    assert SYNC_MODES == ("synchronize", "event", "query")


def test_the_readers_get_what_they_wrote_out_before_the_table() -> None:
    # The gate's fields are the table's, read live: a lever module registered since is in them.
    assert defaults_where("equivalence") == NUMERICS_FIELDS
    # What the gate wrote out before the table, for the table's own levers (`LoopConfig` fields).
    assert {k: v for k, v in NUMERICS_FIELDS.items() if k in FIELD_LEVERS} == {
        "compile": "none",
        "optimizer": "as-built",
        "micro_batches": 1,
        "compile_scope": "model",
        "activation_checkpointing": "none",
        "checkpoint_share": 1.0,
    }
    assert COMPILE_WARMUP_STEPS == {
        "none": 0,
        "default": 1,
        "max-autotune-no-cudagraphs": 1,
        "reduce-overhead": 2,
    }
    assert min_warmup_for_compile(LoopConfig(optimizer="compiled")) == 1
    assert min_warmup_for_compile(LoopConfig(compile="reduce-overhead", optimizer="fused")) == 2
    assert (
        LEVERS["compile"].ordered()
        == "none < default < max-autotune-no-cudagraphs < reduce-overhead"
    )


def test_the_tie_order_names_declared_levers_once() -> None:
    assert len(TIE_ORDER) == len(set(TIE_ORDER))
    assert set(TIE_ORDER) <= set(LEVERS)
