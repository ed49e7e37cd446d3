"""A space adapted to N processes per trial (DDP or FSDP2 under torchrun): the data-parallel
levers searched, what one process alone cannot run left out, each change said in a note."""

from __future__ import annotations

import dataclasses
from typing import Any

from trainers import INERT, LoopConfig, compile_modes, one_of, records_graphs
from tuner.errors import SpaceError
from tuner.search.spaces.space import (
    Choice,
    IntRange,
    SearchSpace,
    Spec,
)
from tuner.search.spaces.staged import pin_off

DATA_PARALLEL_LEVERS: dict[str, Spec] = {
    "parallel": Choice(values=("ddp", "fsdp2")),
    "bucket_cap_mb": Choice(values=(1, 5, 25, 100)),
    "gradient_as_bucket_view": Choice(values=(False, True)),
    "static_graph": Choice(values=(False, True)),
    "reshard_after_forward": Choice(values=(True, False)),
    "fsdp_prefetch": Choice(values=(False, True)),
}
"""What a study of N > 1 processes searches on top of its space: DDP or FSDP2 and each one's
settings (an inert one is reset by `trainers.canonical`, so it makes no duplicate trial)."""
_DP_FLOAT8_NOTE = (
    "parallel fixed to ddp: float8 with FSDP2 is refused (trainers.precision.check_precision)"
)
DATA_PARALLEL_BLOCK_LEVERS: dict[str, Spec] = {
    "compile_scope": Choice(values=("model", "blocks")),
    "activation_checkpointing": Choice(values=("none", "selective", "blocks")),
    "checkpoint_share": Choice(values=(1.0, 0.5)),
}
"""What a study of N > 1 processes adds to a space that searches the compiler, for a model with
repeated blocks: each block compiled on its own (FSDP2 shards block by block, and at 1.1B on one
H100 a block compiled in 12-24 s against 60-110 s for the whole model, docs GPU-FACTS) and
recomputation. compile_scope is inert without a compile mode (`trainers.canonical`)."""


_DP_ALLOWED = "'ddp' or 'fsdp2' with nproc_per_node > 1 (one process per device needs a wrapper)"


_SINGLE_ALLOWED = "'none' with nproc_per_node=1 (DDP and FSDP2 run with --nproc-per-node >= 2)"


_DP_GRAPH_NOTE = "cuda_graph fixed to false: not proven with DDP or FSDP2 (trainers/config.py)"


_DP_REDUCE_NOTE = "compile reduce-overhead left out: not proven with DDP or FSDP2"


_DP_STREAMS_NOTE = "num_streams from 1: the torchrun peers' one stream is searched too"


_DP_PREFETCH_NOTE = "fsdp_prefetch fixed to false: explicit prefetch needs repeated blocks"


_FSDP_LEVERS = ("reshard_after_forward", "fsdp_prefetch")


def _searched_or_fixed(space: SearchSpace, field: str) -> tuple[Any, ...]:
    spec = space.params.get(field)
    if isinstance(spec, Choice):
        return spec.values
    return (space.fixed[field],) if field in space.fixed else ()


def for_processes(
    space: SearchSpace, nproc: int, *, has_blocks: bool = True, precision: str | None = None
) -> SearchSpace:
    """`space` for a study of `nproc` processes on one node.

    One process: data parallelism must stay off (SpaceError naming `parallel` otherwise). More:
    the data-parallel levers (`DATA_PARALLEL_LEVERS`) are searched unless the space already
    searches or pins them; a whole-step CUDA graph is fixed off and reduce-overhead left out
    (each with a note; pinned on, a SpaceError naming it); explicit FSDP2 prefetch is fixed off
    for a model without repeated blocks. A space that searches `compile` also searches, for a
    model with blocks, `DATA_PARALLEL_BLOCK_LEVERS`. Under `precision` float8, `parallel` is
    fixed to ddp (with a note; fsdp2 pinned: a SpaceError naming it)."""
    parallel = _searched_or_fixed(space, "parallel")
    # As given: a pin is one value, a search a list (a pin had been echoed as "['ddp']").
    given = space.fixed["parallel"] if "parallel" in space.fixed else list(parallel)
    if nproc == 1:
        if any(value != "none" for value in parallel):
            raise SpaceError("parallel", given, _SINGLE_ALLOWED)
        return _without_wrapper_levers(space)
    if "none" in parallel:
        raise SpaceError("parallel", given, _DP_ALLOWED)
    if space.fixed.get("cuda_graph") is True:
        raise SpaceError(
            "cuda_graph", True, "false with nproc_per_node > 1 (" + _DP_GRAPH_NOTE + ")"
        )
    pinned = space.fixed.get("compile")
    if isinstance(pinned, str) and records_graphs(pinned):
        raise SpaceError(
            "compile",
            pinned,
            f"{one_of(compile_modes(graphs=False))} with nproc_per_node > 1",
        )
    params = {f: s for f, s in DATA_PARALLEL_LEVERS.items() if f not in space.fixed}
    if has_blocks and "compile" in space.params:
        params |= {f: s for f, s in DATA_PARALLEL_BLOCK_LEVERS.items() if f not in space.fixed}
    params |= space.params
    fixed, notes = dict(space.fixed), list(space.notes)
    _owner_of_pins(params, fixed, notes, precision)
    if precision == "float8":
        _ddp_for_float8(params, fixed, notes)
    pin_off(space, params, fixed, notes, _DP_GRAPH_NOTE)
    streams = params.get("num_streams")
    if isinstance(streams, IntRange) and streams.low > 1:
        # One stream, as the torchrun peers run: under DDP the one-GPU spaces' two-stream
        # prefetching feed lost to it (stages.IDIOM_FEED says where), so it is searched here.
        params["num_streams"] = dataclasses.replace(streams, low=1)
        notes.append(_DP_STREAMS_NOTE)
    compile_spec = params.get("compile")
    if isinstance(compile_spec, Choice) and "reduce-overhead" in compile_spec.values:
        params["compile"] = Choice(
            values=tuple(v for v in compile_spec.values if v != "reduce-overhead")
        )
        notes.append(_DP_REDUCE_NOTE)
    if not has_blocks and "fsdp_prefetch" in params:
        del params["fsdp_prefetch"]
        fixed["fsdp_prefetch"] = False
        notes.append(_DP_PREFETCH_NOTE)
    return dataclasses.replace(space, params=params, fixed=fixed, notes=tuple(notes))


def _without_wrapper_levers(space: SearchSpace) -> SearchSpace:
    """One process: a wrapper's settings a space searches (a user's `bucket_cap_mb`) left out,
    with a note. Each trial had run them inert, unsaid; a space of nothing else is refused by
    `check_left`, naming why."""
    inert = [f for f in DATA_PARALLEL_LEVERS if f != "parallel" and f in space.params]
    if not inert:
        return space
    params = {f: s for f, s in space.params.items() if f not in inert}
    note = f"{', '.join(inert)} left out: DDP and FSDP2 settings, inert with nproc_per_node 1"
    return dataclasses.replace(space, params=params, notes=(*space.notes, note))


def _owner_of_pins(
    params: dict[str, Spec], fixed: dict[str, Any], notes: list[str], precision: str | None
) -> None:
    """Fix a searched `parallel` in place to the one whose setting the user pinned (a DDP bucket
    size means DDP): under the other, each draw reset the pin and no trial kept it. Pins of
    both, or of FSDP2 with float8 (which runs DDP), are a SpaceError naming the later pin."""
    owners: dict[str, str] = {}
    for field, value in fixed.items():
        other, inert_at, default = INERT.get(field, ("", (), None))
        if other == "parallel" and value != default:
            owner = "ddp" if "ddp" not in inert_at else "fsdp2"
            owners.setdefault(owner, field)
    if not owners:
        return
    if len(owners) > 1 or (precision == "float8" and "fsdp2" in owners):
        field = owners["fsdp2"]
        why = "DDP's own are pinned too" if len(owners) > 1 else "float8 runs under DDP"
        raise SpaceError(field, fixed[field], f"{INERT[field][2]!r} ({why}; {field} is FSDP2's)")
    ((owner, field),) = owners.items()
    if "parallel" in params:
        del params["parallel"]
        fixed["parallel"] = owner
        notes.append(f"parallel fixed to {owner}: {field} is pinned, a setting of {owner} only")


def _ddp_for_float8(params: dict[str, Spec], fixed: dict[str, Any], notes: list[str]) -> None:
    """Fix `parallel` to ddp in place: float8 under FSDP2 is refused (trainers.precision)."""
    if fixed.get("parallel") == "fsdp2":
        raise SpaceError("parallel", "fsdp2", "ddp with precision float8 (" + _DP_FLOAT8_NOTE + ")")
    if "parallel" in params:
        del params["parallel"]
        fixed["parallel"] = "ddp"
        notes.append(_DP_FLOAT8_NOTE)
    defaults = LoopConfig().to_dict()
    for field in _FSDP_LEVERS:  # inert under DDP: not searched
        if field in params:
            del params[field]
            fixed[field] = defaults[field]
