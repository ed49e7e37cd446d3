"""What a lever declaration is (`Lever`, `Option`, `Span`) and the live table of them (`TABLE`,
`register`).

A lever is everything the tree needs to know about one setting, in one declaration: its values
and their facts (rank, cost, numerics, warm-up), its kind and default, `added` (whether a stored
config's key holds it at its default), the rule that refuses a value on a device that cannot run
it (`refuse_on`), its effect on the run (`around_forward`: a context the step enters around each
forward) and the values the built-in search spaces offer (`offered`). How to add one:
`trainers.levers`' docstring.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Literal, get_args

from trainers.errors import ConfigError

if TYPE_CHECKING:
    import torch
    from torch import nn

Value = str | int | float | bool
Kind = Literal["str", "bool", "int", "float"]

Cost = Literal["none", "startup", "capture", "compile", "autotune", "compile+record"]
"""What a value costs once per run: `none`; `startup` (worker or peer processes start); `capture`
(a whole-step CUDA graph is captured after eager warm-up steps); `compile` (torch.compile in the
first warm-up step); `autotune` (a compile that also benchmarks kernel candidates: minutes, not
seconds); `compile+record` (a compile, then Inductor's cudagraph trees record)."""

Numerics = Literal["exact", "graph", "equivalence", "distributed"]
"""What the gate owes a value: `exact` (a loop setting: the reference's losses bit for bit);
`graph` (a replay of the eager step: its eager twin's losses bit for bit); `equivalence` (it
changes the arithmetic: within the rounding envelope of the reference); `distributed` (judged by
the data-parallel gate against one process training the same batches)."""

DeviceRule = Callable[[Value, str], "str | None"]
"""`(value, device type)` -> why that value cannot run on such a device ("cpu", "cuda"), or None."""
ForwardContext = Callable[[Value], AbstractContextManager[object]]
"""`value` -> a fresh context the step enters around each forward (and loss)."""
Undo = Callable[[], None]


def nothing() -> None:
    """The `Undo` of a transform that changed nothing (the lever at its default)."""


ModelTransform = Callable[[Value, "nn.Module"], Undo]
"""`(value, the workload's model)` -> how to undo it: the lever's change to the model for one run
(`trainers.core.Engine`: after float8 and the block levers, before the data-parallel wrapper
and the whole-model compile), put back when the run ends. A model that cannot take the value is
a ConfigError naming the lever (one line)."""
PrecisionRule = Callable[[Value, str], "str | None"]
"""`(value, the run's precision)` -> what the lever allows in that precision (a ConfigError's
`allowed`, naming the precision), where `value` cannot run in it; None where it can."""
ModelRule = Callable[[Value, "nn.Module"], "str | None"]
"""`(value, the workload's model)` -> what the lever allows for that model (a ConfigError's
`allowed`), where the model cannot take `value` (not a Hugging Face model, no loss function of
its own); None where it can. What the transform checks first, and what the search's second
stage reads before it enqueues a variant (`trainers.invalid_reason` with `model=`)."""
ConfigRule = Callable[[Value, Callable[[str], Value]], "str | None"]
"""`(value, get)` -> what the lever allows beside the config's other levers (`get(name)` reads
one), where `value` cannot be set with them; None where it can (`LoopConfig` raises the
ConfigError)."""
InertRule = Callable[[Callable[[str], Value]], bool]
"""`get` -> whether the lever does nothing beside the config's other levers (`get(name)` reads
one): `trainers.canonical` puts it back at its default, so a search that samples it beside them
runs that config once instead of refusing it (`conflicts` still refuses it set by hand)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ProbeInput:
    """What a lever's probe runs on: one forward and loss of the workload's `model` on its first
    batch, on the run's device and in its precision, as training runs it (gradients on), and
    that device."""

    forward: Callable[[], object]
    device: torch.device
    model: nn.Module
    # The run's autocast, for a probe that replays part of the step on its own (the loss).
    autocast: Callable[[], AbstractContextManager[object]] = contextlib.nullcontext


Probe = Callable[[ProbeInput], "dict[Value, float | str]"]
"""The lever's microbenchmark at the model's own shapes: for each value, the milliseconds per
training step of the work the lever changes, or why that value cannot run there; empty where
the model does none of that work (the lever changes nothing in it). Seconds, where a trial is a
compile and a run: the search's second stage leaves out a value predicted to gain less than the
tie margin of the leader's step (`tuner.search.proposing.levers`)."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Option:
    """One allowed value of a lever and its facts. No field has a default: a value declared
    without one of them is a TypeError when this module is imported."""

    value: Value
    rank: int
    cost: Cost
    numerics: Numerics
    warmup_steps: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Span:
    """An integer lever's values `low..high` (`high` None: no upper bound). `rank` is `value`
    (more is less simple: more streams, more workers) or `off-default` (0 at the default, 1
    elsewhere: one more setting a user must carry). `cost` and `numerics` are those of every
    value but the default, which costs nothing and is exact."""

    low: int
    high: int | None
    rank: Literal["value", "off-default"]
    cost: Cost
    numerics: Numerics


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Lever:
    """One setting: its values (`options`, or `span` for an integer range), default, a one-line
    `label` for help texts and progress, and the facts below.

    added: 0 for the settings of the first stored configs (always part of a config's key); 1 or
        more for one added after configs were stored: left out of a config's key while at its
        default, so a stored config keeps its key (`tuner.search.spaces.space.config_key`).
        Required: a lever cannot forget it.
    refuse_on: why a value cannot run on a device type (None: it runs everywhere).
    refuse_in: what the lever allows in a precision where a value cannot run (`PrecisionRule`),
        checked where the config and the precision first meet (`trainers.invalid_reason`, the
        run's setup), so the search's second stage does not enqueue what the run would refuse.
    refuse_for: what the lever allows for a model that cannot take a value (`ModelRule`).
    probe: the lever's microbenchmark at the model's shapes (`Probe`; None: none).
    around_forward: the lever's effect as a context around each forward (None: its effect is
        elsewhere, `trainers.core` names the spot).
    transform: the lever's effect as a change to the model for the run (`ModelTransform`).
    conflicts: the rule that refuses a value beside other levers' values (`ConfigRule`).
    inert: where the lever does nothing beside other levers' values (`InertRule`); a search
        runs it there at its default.
    offered: the values the built-in `full`-based search spaces search (empty: the spaces of
        `tuner.search.spaces.named` say, as for the levers declared in `trainers.levers.table`);
        a value that costs a compile only in the spaces that search the compiler.
    unconverted: for a lever whose other values need float8 (`refuse_in`), the value under
        which the work it changes runs as in bf16 (the float8 head's `bf16`); its probe's figure
        for that value is what a bf16 step spends there, so the search's second stage predicts
        moving a bf16 leader into float8 against it (`tuner.search.proposing.levers`). None: no
        such value.
    """

    name: str
    label: str
    kind: Kind
    default: Value
    added: int
    options: tuple[Option, ...] = ()
    span: Span | None = None
    refuse_on: DeviceRule | None = None
    refuse_in: PrecisionRule | None = None
    refuse_for: ModelRule | None = None
    probe: Probe | None = None
    around_forward: ForwardContext | None = None
    transform: ModelTransform | None = None
    conflicts: ConfigRule | None = None
    inert: InertRule | None = None
    offered: tuple[Value, ...] = ()
    unconverted: Value | None = None

    def values(self) -> tuple[Value, ...]:
        """The allowed values in declaration order (empty for a `span` lever)."""
        return tuple(option.value for option in self.options)

    def choices(self) -> tuple[str, ...]:
        """The allowed values of a `str` lever, in declaration order."""
        return tuple(str(value) for value in self.values())

    def allowed(self) -> str:
        """What the lever accepts, in the words a ConfigError uses."""
        if self.kind == "bool":
            return "true or false"
        if self.span is None:
            return "one of " + ", ".join(map(str, self.values()))
        if self.span.high is None:
            return f"an integer >= {self.span.low}"
        return f"an integer in {self.span.low}..{self.span.high}"

    def check(self, value: object) -> None:
        """ConfigError naming the lever and what it accepts, unless `value` is one of its values."""
        if not _is_kind(value, self.kind):
            raise ConfigError(self.name, value, self.allowed())
        if self.span is None:
            ok = value in self.values()
        else:
            assert isinstance(value, int)
            ok = value >= self.span.low and (self.span.high is None or value <= self.span.high)
        if not ok:
            raise ConfigError(self.name, value, self.allowed())

    def option(self, value: Value) -> Option:
        """The facts of `value` (an allowed value; KeyError for one the lever does not declare)."""
        if self.span is None:
            for option in self.options:
                if option.value == value:
                    return option
            raise KeyError(f"{self.name}={value!r} is not declared in trainers.levers")
        rank = self._span_rank(value)
        if value == self.default:
            return Option(value=value, rank=rank, cost="none", numerics="exact", warmup_steps=0)
        span = self.span
        return Option(
            value=value, rank=rank, cost=span.cost, numerics=span.numerics, warmup_steps=0
        )

    def _span_rank(self, value: Value) -> int:
        assert self.span is not None and isinstance(value, int)
        return value if self.span.rank == "value" else int(value != self.default)

    def rank(self, value: Value) -> int:
        return self.option(value).rank

    def cost_order(self, value: Value) -> int:
        """Where `value`'s one-off cost falls in `Cost`'s order, cheapest (`none`) first."""
        return get_args(Cost).index(self.option(value).cost)

    def ordered(self) -> str:
        """The declared values from simplest to least simple, as "a < b < c" (for help texts)."""
        options = sorted(self.options, key=lambda option: option.rank)
        return " < ".join(str(option.value) for option in options)

    def refusal(self, value: Value, device_type: str) -> str | None:
        """Why `value` cannot run on a device of `device_type`, or None."""
        return None if self.refuse_on is None else self.refuse_on(value, device_type)

    def precision_refusal(self, value: Value, precision: str) -> ConfigError | None:
        """The ConfigError naming this lever where `value` cannot run in `precision`, or None."""
        allowed = None if self.refuse_in is None else self.refuse_in(value, precision)
        return None if allowed is None else ConfigError(self.name, value, allowed)

    def model_refusal(self, value: Value, model: nn.Module) -> ConfigError | None:
        """The ConfigError naming this lever where `model` cannot take `value`, or None."""
        allowed = None if self.refuse_for is None else self.refuse_for(value, model)
        return None if allowed is None else ConfigError(self.name, value, allowed)

    def keyed_at(self, value: Value) -> bool:
        """Whether a config's key holds this lever at `value` (see `added`)."""
        return self.added == 0 or value != self.default


def _is_kind(value: object, kind: Kind) -> bool:
    # bool is an int subclass; True as a stream count is a typo, not a setting.
    if kind == "bool":
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    if kind == "str":
        return isinstance(value, str)
    if kind == "int":
        return isinstance(value, int)
    return isinstance(value, int | float)


def ranked(*entries: tuple[Value, Cost, Numerics, int]) -> tuple[Option, ...]:
    """Options ranked in the order written, simplest first: (value, cost, numerics, warm-up)."""
    return tuple(
        Option(value=value, rank=rank, cost=cost, numerics=numerics, warmup_steps=warmup)
        for rank, (value, cost, numerics, warmup) in enumerate(entries)
    )


def flag(default: bool, cost: Cost, numerics: Numerics) -> tuple[Option, ...]:
    """A switch's two options: the default costs nothing and is exact; the other carries the
    switch's facts and ranks 1 (one more setting a user must carry)."""
    return ranked((default, "none", "exact", 0), (not default, cost, numerics, 0))


TABLE: dict[str, Lever] = {}
"""Every lever by name: `LoopConfig`'s fields in field order, then the lever modules' levers in
the order they were registered. Read live: everything that lists levers iterates this."""
FIELD_LEVERS: set[str] = set()
"""The names of the levers that are `LoopConfig` fields (the rest live in its `modules`)."""


def register(lever: Lever, *, field: bool = False) -> None:
    """Add `lever` to the table. `field`: it is a `LoopConfig` field (the table's own levers);
    otherwise `LoopConfig.modules` carries its value. ValueError for a name already taken or a
    module lever with `added` 0 (it would change every stored config's key)."""
    if lever.unconverted is not None:
        lever.check(lever.unconverted)  # a typo would leave every move into float8 unpredicted
    if lever.name in TABLE:
        raise ValueError(f"a lever named {lever.name!r} is already declared")
    if not field and lever.added < 1:
        raise ValueError(
            f"{lever.name}: a lever added after configs were stored needs added >= 1, so a "
            "stored config keeps its key"
        )
    lever.check(lever.default)
    TABLE[lever.name] = lever
    if field:
        FIELD_LEVERS.add(lever.name)


def unregister(name: str) -> None:
    """Take a lever module's lever out of the table (a test's own lever, when it ends)."""
    if name in FIELD_LEVERS:
        raise ValueError(f"{name} is a LoopConfig field: it cannot be taken out")
    del TABLE[name]


def transformed(model: nn.Module, get: Callable[[str], Value]) -> Undo:
    """Apply every lever's `transform` at its value (`get(name)`) to `model`, in table order;
    the returned undo puts them back in reverse. One that raises undoes those before it."""
    undos: list[Undo] = []

    def undo() -> None:
        for step in reversed(undos):
            step()
        undos.clear()

    for name, lever in TABLE.items():
        if lever.transform is None:
            continue
        try:
            undos.append(lever.transform(get(name), model))
        except BaseException:
            undo()
            raise
    return undo


def conflict(get: Callable[[str], Value]) -> ConfigError | None:
    """The first lever whose `conflicts` rule refuses its value beside the others, as the
    ConfigError to raise (None: none does)."""
    for name, lever in TABLE.items():
        if lever.conflicts is None:
            continue
        allowed = lever.conflicts(get(name), get)
        if allowed is not None:
            return ConfigError(name, get(name), allowed)
    return None


@contextlib.contextmanager
def registered(lever: Lever) -> Iterator[Lever]:
    """`lever` in the table for the duration of the block (tests declare their own levers so)."""
    register(lever)
    try:
        yield lever
    finally:
        unregister(lever.name)
