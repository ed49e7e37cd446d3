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

from typing import Literal

from trainers.levers.declare import (
    TABLE,
    Lever,
    Numerics,
    Option,
    Span,
    Value,
    flag,
    ranked,
    register,
)

SyncMode = Literal["synchronize", "event", "query"]
CompileMode = Literal["none", "default", "max-autotune-no-cudagraphs", "reduce-overhead"]
OptimizerChoice = Literal["as-built", "foreach", "fused", "compiled"]
CompileScope = Literal["model", "blocks"]
Checkpointing = Literal["none", "blocks", "selective"]
Parallel = Literal["none", "ddp", "fsdp2"]

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
        added=0,
        span=Span(low=1, high=MAX_STREAMS, rank="value", cost="none", numerics="exact"),
    ),
    Lever(
        name="sync_interval",
        label="the host waits for the GPU and reads the losses every N steps",
        kind="int",
        default=1,
        added=0,
        span=Span(low=1, high=MAX_SYNC_INTERVAL, rank="value", cost="none", numerics="exact"),
    ),
    Lever(
        name="sync_mode",
        label="how the host waits: synchronize, an event, or polling an event",
        kind="str",
        default="synchronize",
        added=0,
        options=ranked(
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
        added=0,
        span=Span(low=0, high=MAX_PREFETCH, rank="value", cost="none", numerics="exact"),
    ),
    Lever(
        name="pin_memory",
        label="the DataLoader returns page-locked batches",
        kind="bool",
        default=False,
        added=0,
        options=flag(False, "none", "exact"),
    ),
    Lever(
        name="non_blocking",
        label="host-to-device copies are asynchronous with respect to the host",
        kind="bool",
        default=False,
        added=0,
        options=flag(False, "none", "exact"),
    ),
    Lever(
        name="num_workers",
        label="DataLoader worker processes (0: batches made in the training process)",
        kind="int",
        default=0,
        added=0,
        span=Span(low=0, high=MAX_WORKERS, rank="value", cost="startup", numerics="exact"),
    ),
    Lever(
        name="cuda_graph",
        label="forward, backward and optimizer step captured once in a CUDA graph and replayed",
        kind="bool",
        default=False,
        added=0,
        options=flag(False, "capture", "graph"),
        refuse_on=lambda value, device: (
            f"cuda_graph=True needs a CUDA device, and this run is on {device}"
            if value is True and device != "cuda"
            else None
        ),
    ),
)

_COMPILER = (
    Lever(
        name="compile",
        label="torch.compile of the model",
        kind="str",
        default="none",
        added=1,
        # Warm-up: Dynamo compiles in the first step; cudagraph trees run a compiled graph
        # eagerly once, record it on the second call and replay from the third.
        options=ranked(
            ("none", "none", "exact", 0),
            ("default", "compile", "equivalence", 1),
            ("max-autotune-no-cudagraphs", "autotune", "equivalence", 1),
            ("reduce-overhead", "compile+record", "equivalence", 2),
        ),
        refuse_on=lambda value, device: (
            f"compile={value!r} needs a CUDA device (it adds CUDA graphs), and this run is on "
            f"{device}; use compile='default'"
            if device != "cuda" and records_graphs(str(value))
            else None
        ),
    ),
    Lever(
        name="optimizer",
        label="the optimizer's implementation",
        kind="str",
        default="as-built",
        added=1,
        # foreach and fused kernels sum in another order than the per-parameter loop.
        options=ranked(
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
        added=2,
        options=ranked(
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
        added=2,
        options=ranked(
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
        added=2,
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
        added=2,
        options=ranked(("model", "none", "exact", 0), ("blocks", "none", "equivalence", 0)),
    ),
)

_DATA_PARALLEL = (
    Lever(
        name="parallel",
        label="one process, DistributedDataParallel, or FSDP2 under torchrun",
        kind="str",
        default="none",
        added=3,
        options=ranked(
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
        added=3,
        span=Span(
            low=1, high=MAX_BUCKET_CAP_MB, rank="off-default", cost="none", numerics="distributed"
        ),
    ),
    Lever(
        name="gradient_as_bucket_view",
        label="DDP's gradients are views into its buckets",
        kind="bool",
        default=False,
        added=3,
        options=flag(False, "none", "distributed"),
    ),
    Lever(
        name="static_graph",
        label="DDP may assume the same parameters and hook order every step",
        kind="bool",
        default=False,
        added=3,
        options=flag(False, "none", "distributed"),
    ),
    Lever(
        name="reshard_after_forward",
        label="FSDP2 frees each block's gathered parameters after its forward",
        kind="bool",
        default=True,
        added=3,
        options=flag(True, "none", "distributed"),
    ),
    Lever(
        name="fsdp_prefetch",
        label="FSDP2 all-gathers the next block's parameters explicitly",
        kind="bool",
        default=False,
        added=3,
        options=flag(False, "none", "distributed"),
    ),
)

DECLARED: tuple[Lever, ...] = (*_LOOP, *_COMPILER, *_SCALE, *_DATA_PARALLEL)
"""Every declaration as written (a test holds each LoopConfig field declared exactly once)."""
for _declared in DECLARED:
    register(_declared, field=True)
LEVERS: dict[str, Lever] = TABLE
"""Every lever by name: `LoopConfig`'s fields in field order, then the lever modules' levers
(`trainers.levers.declare.TABLE`, read live)."""

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
    """The declaration of `name`; KeyError for a name no lever has."""
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
