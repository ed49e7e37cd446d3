"""The first stage of a search over the compiler levers: the lever corners on a sensible feed.

A trial of the `compile` space costs a compile (20-140 s on a cold Inductor cache), so a TPE
start-up of random points spends most of a budget on configs that differ only in settings that
do not matter while the levers that do (compile mode x whole-step graph x optimizer) are barely
sampled. `first_stage(space, ...)` returns the corners of those levers, each on one fixed feed
(two streams, event sync every 10 steps, two batches prefetched from pinned memory), for the
study to enqueue before the sampler takes over: the sampler then searches the feed and sync
settings with the corners' results already in its history, so it explores around the best
lever combination instead of finding the levers by chance. A data-parallel study (N > 1
processes per trial) starts from its own corners (`DATA_PARALLEL_CORNERS`).

A corner is adapted to the space it runs in: a pinned setting keeps its pin, a value the space
does not offer is replaced by the nearest one it does (the first offered optimizer of fused,
foreach, as-built; an integer clamped into its range), and a corner the harness would refuse on
this device and precision (`trainers.invalid_reason`) is left out. Two corners that become the
same config are enqueued once. Spaces without the levers (`streams`, `full`) get no first stage.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import trainers
from tuner.search.spaces.space import Choice, IntRange, SearchSpace
from tuner.store import keys

# A space that searches neither of these (`streams`, `full`) keeps its plain sampler start.
COMPILER_LEVERS = ("compile", "optimizer")

# The corners, most promising first (GPU-FACTS, "What a user would pick instead"): the eager
# whole-step graph streamtune recommended before, the compiled step under one whole-step graph,
# Inductor's own CUDA graphs (what users write), and the compiled step without graphs.
CORNERS: tuple[dict[str, Any], ...] = (
    {"compile": "none", "optimizer": "fused", "cuda_graph": True},
    {"compile": "default", "optimizer": "fused", "cuda_graph": True},
    {"compile": "reduce-overhead", "optimizer": "fused", "cuda_graph": False},
    {"compile": "default", "optimizer": "fused", "cuda_graph": False},
)

# The scale space's corners (models of 0.3-8B parameters), cheapest to compile first: each block
# compiled (one block's graph, compiled once and reused by every block: 12-24 s at 1.1B on an
# H100), then the whole model (60-110 s). No order of the two scopes is right for every model:
# on the `llama-1b` preset the whole model was 1.02-1.04x faster, on another Llama-family 1.1B
# shape each block was 1.16-1.17x faster (H100, docs/benchmarks/README.md). So both are
# measured, the cheap one first, and the screen (tuner/search/proposing/screen.py) prunes the loser
# of the two without gating it. Then, for a step that does not fit, the cheapest ways down in
# memory: two micro-batches, selective checkpointing of every block, full checkpointing of half the
# blocks, four micro-batches; where the plain step fits they are predicted to lose and are not
# run (tuner/search/proposing/predict.py).
SCALE_LEVERS = ("compile_scope", "activation_checkpointing", "checkpoint_share", "micro_batches")
SCALE_CORNERS: tuple[dict[str, Any], ...] = (
    {"compile_scope": "blocks"},
    {"compile_scope": "model"},
    {"compile_scope": "blocks", "micro_batches": 2},
    {"compile_scope": "blocks", "activation_checkpointing": "selective"},
    {"compile_scope": "blocks", "activation_checkpointing": "blocks", "checkpoint_share": 0.5},
    {"compile_scope": "blocks", "micro_batches": 4},
)

# A data-parallel study's corners (N > 1 processes per trial, each trial a torchrun launch), what
# users of several GPUs write, on the compiled step with the fused optimizer, cheapest compile
# first as measured on one H100 at 1.1B (docs GPU-FACTS: a block compiled in 12-24 s, the whole
# model in 60-110 s): DDP and FSDP2 each with every block compiled, DDP around the whole
# compiled model (the torchrun peer "DDP + torch.compile + fused"), then FSDP2 keeping each
# block's gathered parameters to its backward (one all-gather per block and step fewer). The
# baselines already measure eager DDP with its defaults, so no corner repeats it. A model
# without blocks collapses them to DDP and FSDP2 around the whole compiled model; under float8
# (DDP only, trainers.precision) to DDP's. The screen (tuner/search/proposing/screen.py) stops a
# losing corner after two windows, ungated, so a weak corner costs one short launch.
#
# Before them, the torchrun peers themselves, exactly as a user writes them (the PyTorch idiom's
# feed: one stream, the loss read every step, nothing prefetched): DDP around the whole compiled
# model with fused AdamW, and FSDP2 with each block compiled. On 4 H100s (transformer:medium,
# 2026-11-27, docs/benchmarks/data-parallel-h100-2026-11-27-medium.md) the DDP peer ran at 30.6
# ms/step against 36.6 for the same levers on the prefetching feed, which the search had
# recommended: under DDP the feed that wins on one GPU can lose, so the search measures what it
# is compared with instead of assuming it.
IDIOM_FEED: dict[str, Any] = {
    "num_streams": 1,
    "sync_mode": "synchronize",
    "sync_interval": 1,
    "prefetch_depth": 0,
    "pin_memory": False,
    "num_workers": 0,
    "non_blocking": False,
}
DATA_PARALLEL_CORNERS: tuple[dict[str, Any], ...] = (
    {"parallel": "ddp", "compile": "default", "compile_scope": "model", "optimizer": "fused"}
    | IDIOM_FEED,
    {"parallel": "fsdp2", "compile": "default", "compile_scope": "blocks", "optimizer": "fused"}
    | IDIOM_FEED,
    {"parallel": "ddp", "compile": "default", "compile_scope": "blocks", "optimizer": "fused"},
    {"parallel": "fsdp2", "compile": "default", "compile_scope": "blocks", "optimizer": "fused"},
    {"parallel": "ddp", "compile": "default", "compile_scope": "model", "optimizer": "fused"},
    {
        "parallel": "fsdp2",
        "compile": "default",
        "compile_scope": "blocks",
        "optimizer": "fused",
        "reshard_after_forward": False,
    },
)

# The feed every corner runs on: what the seed design and a careful user would both start from.
FEED: dict[str, Any] = {
    "num_streams": 2,
    "sync_mode": "event",
    "sync_interval": 10,
    "prefetch_depth": 2,
    "pin_memory": True,
    "num_workers": 0,
    "non_blocking": True,
}

_OPTIMIZER_FALLBACK = ("fused", "foreach", "as-built")


def _offered(spec: Choice | IntRange, wanted: Any, field: str) -> Any:
    if isinstance(spec, IntRange):
        return min(max(int(wanted), spec.low), spec.high)
    if wanted in spec.values:
        return wanted
    if field == "optimizer":
        for value in _OPTIMIZER_FALLBACK:
            if value in spec.values:
                return value
    return spec.values[0]


def first_stage(
    space: SearchSpace,
    *,
    device_type: str,
    precision: str | None = None,
) -> list[dict[str, Any]]:
    """The params (the space's searched settings only) of each corner to enqueue, in order."""
    scale = any(field in space.params for field in SCALE_LEVERS)
    if not scale and not any(field in space.params for field in COMPILER_LEVERS):
        return []
    defaults = trainers.LoopConfig().to_dict()
    chosen: list[dict[str, Any]] = []
    seen: set[tuple[tuple[str, Any], ...]] = set()
    data_parallel = "parallel" in space.params or space.fixed.get("parallel", "none") != "none"
    corners = DATA_PARALLEL_CORNERS if data_parallel else SCALE_CORNERS if scale else CORNERS
    for corner in corners:
        # A space searching a field beyond the feed and the levers (a custom one) starts it at
        # its default.
        wanted = defaults | FEED | corner
        params = {
            field: _offered(spec, wanted[field], field) for field, spec in space.params.items()
        }
        values = trainers.canonical(space.fixed | params, pinned=space.fixed)
        params = {field: values[field] for field in params}
        if trainers.invalid_reason(values, precision=precision, device_type=device_type):
            continue
        key = tuple(sorted(values.items()))
        if key in seen:
            continue
        seen.add(key)
        chosen.append(params)
    return chosen


def first_trials(
    space: SearchSpace, device_type: str, precision: str | None, precisions: Sequence[str]
) -> list[dict[str, Any]]:
    """The lever corners (`first_stage`) in `precision`; with several `precisions` allowed (the
    trials' param), each corner in each precision where it is valid (corner by corner, so a
    short study sees them all), or, in a space without corners (a CPU's), one trial in each
    precision, its settings sampled: every precision the user allowed is measured and gated,
    however short the study."""
    if not precisions:
        return first_stage(space, device_type=device_type, precision=precision)
    by_precision = {
        each: first_stage(space, device_type=device_type, precision=each) for each in precisions
    }
    if not any(by_precision.values()):
        return [{keys.PRECISION: each} for each in precisions]
    corners: list[dict[str, Any]] = []
    for index in range(max((len(c) for c in by_precision.values()), default=0)):
        for each, chosen in by_precision.items():
            if index < len(chosen):
                corners.append(chosen[index] | {keys.PRECISION: each})
    return corners
