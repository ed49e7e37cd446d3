"""The lever table: each `LoopConfig` setting declared once, with every fact the rest of the tree
needs about its values.

A lever is one `LoopConfig` field. Its declaration says which values it takes (a finite list of
`Option`s, or an integer `Span`), its default (the PyTorch idiom, `trainers.REFERENCE`), and for
each value:
- `rank`: how simple it is (smaller = simpler); the tuner's tie rule compares configs by the
  ranks of the levers in `TIE_ORDER`, in that order;
- `cost`: what it costs once per run, before the steps are steady (`Cost`), and `warmup_steps`,
  the warm-up steps that keep that cost out of the timed windows;
- `numerics`: what the correctness gate owes it (`Numerics`).

`LoopConfig` validates each field with `Lever.check`, the gate's `NUMERICS_FIELDS`, the compile
warm-up, the tie rule and the default search space's compile choices read this table, so a new
value of a lever is one `Option` here (and, for a `str` lever, its name in the `Literal` type
below, which mypy and the API schema read). Which values combine with which other settings is
`trainers.config`'s, since a rule there names two levers.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from trainers.errors import ConfigError

SyncMode = Literal["synchronize", "event", "query"]
CompileMode = Literal["none", "default", "max-autotune-no-cudagraphs", "reduce-overhead"]
OptimizerChoice = Literal["as-built", "foreach", "fused", "compiled"]
CompileScope = Literal["model", "blocks"]
Checkpointing = Literal["none", "blocks", "selective"]
Parallel = Literal["none", "ddp", "fsdp2"]

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
    """One `LoopConfig` field: its values (`options`, or `span` for an integer range), default,
    and a one-line `label` for help texts."""

    name: str
    label: str
    kind: Kind
    default: Value
    options: tuple[Option, ...] = ()
    span: Span | None = None

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

    def ordered(self) -> str:
        """The declared values from simplest to least simple, as "a < b < c" (for help texts)."""
        options = sorted(self.options, key=lambda option: option.rank)
        return " < ".join(str(option.value) for option in options)


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


def _ranked(*entries: tuple[Value, Cost, Numerics, int]) -> tuple[Option, ...]:
    """Options ranked in the order written, simplest first: (value, cost, numerics, warm-up)."""
    return tuple(
        Option(value=value, rank=rank, cost=cost, numerics=numerics, warmup_steps=warmup)
        for rank, (value, cost, numerics, warmup) in enumerate(entries)
    )


def _flag(default: bool, cost: Cost, numerics: Numerics) -> tuple[Option, ...]:
    """A switch's two options: the default costs nothing and is exact; the other carries the
    switch's facts and ranks 1 (one more setting a user must carry)."""
    return _ranked((default, "none", "exact", 0), (not default, cost, numerics, 0))


MAX_STREAMS = 4
MAX_PREFETCH = 4
MAX_WORKERS = 32
MAX_BUCKET_CAP_MB = 1024
MAX_SYNC_INTERVAL = 10_000
"""One bound for the CLI, the API and the harness (the API alone capped it here before): a read
every 10,000 steps is already fewer than once per run of any measurement or job here."""

_LOOP = (
    Lever(
        name="num_streams",
        label="CUDA streams the step uses (1: the current stream, the PyTorch idiom)",
        kind="int",
        default=1,
        span=Span(low=1, high=MAX_STREAMS, rank="value", cost="none", numerics="exact"),
    ),
    Lever(
        name="sync_interval",
        label="the host waits for the GPU and reads the losses every N steps",
        kind="int",
        default=1,
        span=Span(low=1, high=MAX_SYNC_INTERVAL, rank="value", cost="none", numerics="exact"),
    ),
    Lever(
        name="sync_mode",
        label="how the host waits: synchronize, an event, or polling an event",
        kind="str",
        default="synchronize",
        options=_ranked(
            ("synchronize", "none", "exact", 0),
            ("event", "none", "exact", 0),
            ("query", "none", "exact", 0),
        ),
    ),
    Lever(
        name="prefetch_depth",
        label="batches copied to the device ahead of the step that uses them",
        kind="int",
        default=0,
        span=Span(low=0, high=MAX_PREFETCH, rank="value", cost="none", numerics="exact"),
    ),
    Lever(
        name="pin_memory",
        label="the DataLoader returns page-locked batches",
        kind="bool",
        default=False,
        options=_flag(False, "none", "exact"),
    ),
    Lever(
        name="non_blocking",
        label="host-to-device copies are asynchronous with respect to the host",
        kind="bool",
        default=False,
        options=_flag(False, "none", "exact"),
    ),
    Lever(
        name="num_workers",
        label="DataLoader worker processes (0: batches made in the training process)",
        kind="int",
        default=0,
        span=Span(low=0, high=MAX_WORKERS, rank="value", cost="startup", numerics="exact"),
    ),
    Lever(
        name="cuda_graph",
        label="forward, backward and optimizer step captured once in a CUDA graph and replayed",
        kind="bool",
        default=False,
        options=_flag(False, "capture", "graph"),
    ),
)

_COMPILER = (
    Lever(
        name="compile",
        label="torch.compile of the model",
        kind="str",
        default="none",
        # Warm-up: Dynamo compiles in the first step; cudagraph trees run a compiled graph
        # eagerly once, record it on the second call and replay from the third.
        options=_ranked(
            ("none", "none", "exact", 0),
            ("default", "compile", "equivalence", 1),
            ("max-autotune-no-cudagraphs", "autotune", "equivalence", 1),
            ("reduce-overhead", "compile+record", "equivalence", 2),
        ),
    ),
    Lever(
        name="optimizer",
        label="the optimizer's implementation",
        kind="str",
        default="as-built",
        # foreach and fused kernels sum in another order than the per-parameter loop.
        options=_ranked(
            ("as-built", "none", "exact", 0),
            ("foreach", "none", "equivalence", 0),
            ("fused", "none", "equivalence", 0),
            ("compiled", "compile", "equivalence", 1),
        ),
    ),
)

# Accumulating micro-batches sums the gradients in another order, and a block compiled on its own
# fuses other kernels than the whole model: both train the same model, neither bit for bit, so
# equivalence decides. So does activation checkpointing: an eager recompute runs the same kernels
# on the same inputs, bit for bit on a CPU, but on the H100 a checkpointed bf16 Llama-style
# decoder left the plain step's losses by 2e-5 at step 10
# (docs/benchmarks/gpu-tests-h100-2026-11-25-f111199.md): the backward's kernels are chosen for
# other buffers. An exact test would reject the lever on the models that need it.
_SCALE = (
    Lever(
        name="micro_batches",
        label="micro-batches each step's batch is split into, one optimizer step after the last",
        kind="int",
        default=1,
        options=_ranked(
            (1, "none", "exact", 0),
            (2, "none", "equivalence", 0),
            (4, "none", "equivalence", 0),
            (8, "none", "equivalence", 0),
        ),
    ),
    Lever(
        name="activation_checkpointing",
        label="recompute the repeated blocks' activations in the backward",
        kind="str",
        default="none",
        options=_ranked(
            ("none", "none", "exact", 0),
            ("blocks", "none", "equivalence", 0),
            ("selective", "none", "equivalence", 0),
        ),
    ),
    Lever(
        name="checkpoint_share",
        label="the share of the blocks checkpointed (the first ones)",
        kind="float",
        default=1.0,
        options=(
            Option(value=0.25, rank=2, cost="none", numerics="equivalence", warmup_steps=0),
            Option(value=0.5, rank=1, cost="none", numerics="equivalence", warmup_steps=0),
            Option(value=1.0, rank=0, cost="none", numerics="exact", warmup_steps=0),
        ),
    ),
    Lever(
        name="compile_scope",
        label="compile the whole model, or each repeated block on its own",
        kind="str",
        default="model",
        options=_ranked(("model", "none", "exact", 0), ("blocks", "none", "equivalence", 0)),
    ),
)

_DATA_PARALLEL = (
    Lever(
        name="parallel",
        label="one process, DistributedDataParallel, or FSDP2 under torchrun",
        kind="str",
        default="none",
        options=_ranked(
            ("none", "none", "exact", 0),
            ("ddp", "startup", "distributed", 0),
            ("fsdp2", "startup", "distributed", 0),
        ),
    ),
    Lever(
        name="bucket_cap_mb",
        label="DDP's gradient bucket size in MiB",
        kind="int",
        default=25,
        span=Span(
            low=1, high=MAX_BUCKET_CAP_MB, rank="off-default", cost="none", numerics="distributed"
        ),
    ),
    Lever(
        name="gradient_as_bucket_view",
        label="DDP's gradients are views into its buckets",
        kind="bool",
        default=False,
        options=_flag(False, "none", "distributed"),
    ),
    Lever(
        name="static_graph",
        label="DDP may assume the same parameters and hook order every step",
        kind="bool",
        default=False,
        options=_flag(False, "none", "distributed"),
    ),
    Lever(
        name="reshard_after_forward",
        label="FSDP2 frees each block's gathered parameters after its forward",
        kind="bool",
        default=True,
        options=_flag(True, "none", "distributed"),
    ),
    Lever(
        name="fsdp_prefetch",
        label="FSDP2 all-gathers the next block's parameters explicitly",
        kind="bool",
        default=False,
        options=_flag(False, "none", "distributed"),
    ),
)

DECLARED: tuple[Lever, ...] = (*_LOOP, *_COMPILER, *_SCALE, *_DATA_PARALLEL)
"""Every declaration as written (a test holds each LoopConfig field declared exactly once)."""
LEVERS: dict[str, Lever] = {lever.name: lever for lever in DECLARED}
"""Every lever by name, in `LoopConfig` field order."""

TIE_ORDER: tuple[str, ...] = (
    "parallel",
    "compile",
    "optimizer",
    "num_streams",
    "cuda_graph",
    "prefetch_depth",
    "num_workers",
    "sync_mode",
    "pin_memory",
    "non_blocking",
    "sync_interval",
    "bucket_cap_mb",
    "gradient_as_bucket_view",
    "static_graph",
    "reshard_after_forward",
    "fsdp_prefetch",
)
"""The levers the tie rule compares, most decisive first: a compile is paid in every run that
adopts it, so compilation comes before the loop settings. The scale levers (micro_batches,
activation checkpointing, compile_scope) are left out, as they were before this table: adding
them would change which of two tied stored configs a study recommends."""


def lever(name: str) -> Lever:
    """The declaration of `name`; KeyError for a name that is not a LoopConfig field."""
    return LEVERS[name]


def compile_modes(*, graphs: bool = True, compiled: bool = False) -> tuple[str, ...]:
    """The compile modes in declaration order; `graphs=False` leaves out those that record
    Inductor's CUDA graphs (cost `compile+record`: refused beside a whole-step graph, several
    processes, micro-batches or a CPU), `compiled=True` leaves out `none`."""
    return tuple(
        str(option.value)
        for option in LEVERS["compile"].options
        if (graphs or option.cost != "compile+record") and (not compiled or option.cost != "none")
    )


def records_graphs(mode: str) -> bool:
    """Whether compile mode `mode` records Inductor's CUDA graphs (cost `compile+record`)."""
    return mode in compile_modes() and mode not in compile_modes(graphs=False)


def one_of(values: tuple[str, ...]) -> str:
    """`values` in words: "a", "a or b", "a, b or c"."""
    return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} or {values[-1]}"


def defaults_where(numerics: Numerics) -> dict[str, Value]:
    """Lever name -> default, for the levers with at least one value of class `numerics`."""
    out: dict[str, Value] = {}
    for item in LEVERS.values():
        classes = {option.numerics for option in item.options}
        if item.span is not None:
            classes.add(item.span.numerics)
        if numerics in classes:
            out[item.name] = item.default
    return out
