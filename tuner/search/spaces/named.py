"""Where search spaces come from: the built-ins, a JSON file, a mapping, and `--fix` pins.

`load_space(spec, fix=..., cuda=...)` is the one entry point: `spec` is "auto" (the default:
"compile" without max-autotune on a GPU, "full" on a CPU), "streams", "full" (everything but
`non_blocking`), "compile" (`full` plus the compiler levers), a path ending in .json, or a mapping
of the same shape as such a file (what the API and the workers pass: no file in between). Pins come
as "name=value" strings (the CLI's `--fix`) or as a mapping of typed values (a job's `fix`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from trainers import COMPILE_MODES, LEVERS, LoopConfig, compile_modes, one_of, records_graphs
from trainers.program import Program
from tuner.errors import SpaceError
from tuner.search.spaces.own import own_space
from tuner.search.spaces.pins import parse_fix, pins_from_mapping
from tuner.search.spaces.space import (
    Choice,
    IntRange,
    SearchSpace,
    Spec,
)
from tuner.search.spaces.staged import pin_off

if TYPE_CHECKING:
    from torch import nn

    from trainers import Lever

BUILTIN_SPACES: tuple[str, ...] = ("auto", "streams", "full", "compile", "scale")
# `compile` on a GPU, `full` on a CPU: on an H100 the compiler levers made the recommendation
# 1.1x-2.8x faster than the best plain loop a user writes (docs/benchmarks/peers-h100-*); on a
# CPU every trial pays an Inductor C++ compile that nobody has measured paying back.
DEFAULT_SPACE = "auto"

_SPACE_ALLOWED = "auto, streams, full, compile, scale or a .json file"

SCALE_PARAMS = 250_000_000
"""From this many trainable parameters, `auto` on a GPU means `scale`: at 125M every strong loop
landed within 3 % of the others (the loop overhead is gone), at 1.1B the decisive choices were
how memory and FLOPs are spent (H100, 2026-11-24; docs/method.md)."""
_CPU_GRAPH_NOTE = "cuda_graph fixed to false: no CUDA device"
_CPU_GRAPH_ALLOWED = "false (CUDA graphs need a CUDA device)"
_CPU_REDUCE_NOTE = "compile reduce-overhead left out: its CUDA graphs need a CUDA device"
_CPU_REDUCE_ALLOWED = (
    f"{one_of(compile_modes(graphs=False))} (a mode with CUDA graphs needs a CUDA device)"
)

# --------------------------------------------------------------------------------------------
# built-in spaces and files
# --------------------------------------------------------------------------------------------

_STREAMS_PARAMS: dict[str, Spec] = {
    "num_streams": IntRange(low=2, high=4),
    "sync_interval": IntRange(low=1, high=100, log=True),
    "sync_mode": Choice(values=("event", "synchronize", "query")),
}


def streams_space() -> SearchSpace:
    """The seed design: streams 2..4, sync interval 1..100 (log), sync mode; the rest pinned."""
    return SearchSpace(
        name="streams",
        params=dict(_STREAMS_PARAMS),
        fixed={
            "pin_memory": True,
            "non_blocking": True,
            "prefetch_depth": 0,
            "num_workers": 0,
            "cuda_graph": False,
        },
    )


def full_space() -> SearchSpace:
    """The default: `streams` plus cuda_graph, prefetch_depth 0..4, pin_memory, num_workers."""
    return SearchSpace(
        name="full",
        params={
            **_STREAMS_PARAMS,
            "cuda_graph": Choice(values=(False, True)),
            "prefetch_depth": IntRange(low=0, high=4),
            "pin_memory": Choice(values=(False, True)),
            "num_workers": Choice(values=(0, 1, 2, 4)),
            **offered(compiles=False),
        },
        fixed={"non_blocking": True},
    )


def offered(*, compiles: bool = True) -> dict[str, Spec]:
    """The levers that declare `offered` values, each searched over them (the lever table's
    word: a lever module's lever is in the built-in spaces without an edit here). A value that
    costs a compile (the compiled loss) only with `compiles`: in `scale`, which compiles each
    layer or the whole model, not in `full` and the spaces built on it (`compile`), whose trials
    compile nothing or the whole model, beside which the compiled loss does nothing."""
    found: dict[str, Spec] = {}
    for name, item in LEVERS.items():
        values = tuple(v for v in item.offered if compiles or item.option(v).cost != "compile")
        if len(values) > 1:
            found[name] = Choice(values=values)
    return found


def without_model_refusals(space: SearchSpace, model: nn.Module) -> SearchSpace:
    """`space` with the searched values `model` cannot take (`Lever.refuse_for`: the compiled
    loss of a model without a loss function) left out: they would only be drawn to be refused.
    A built-in space's lever left with its default alone leaves the search without a note, so
    the space a study stores is the one it stored before the lever was offered and the study
    resumes; otherwise it is narrowed or fixed, with a note (`_leave_out`). A pinned one fails
    before the first trial, naming it (`tuner.search.spaces.pinned`)."""

    def refused(item: Lever, value: Any) -> bool:
        return item.model_refusal(value, model) is not None

    return _without_values(space, refused, f"{type(model).__name__} cannot take it")


def without_precision_refusals(space: SearchSpace, precisions: Sequence[str]) -> SearchSpace:
    """`space` with the searched values that none of the study's `precisions` can run
    (`Lever.refuse_in`: the head in float8 in a study that never runs float8) left out, as
    `without_model_refusals` leaves out what the model cannot take: drawn, they could only be
    refused."""

    def refused(item: Lever, value: Any) -> bool:
        return all(item.precision_refusal(value, p) is not None for p in precisions)

    runs = ", ".join(precisions)
    return _without_values(space, refused, f"no precision the study runs ({runs}) takes it")


def _without_values(
    space: SearchSpace, refused: Callable[[Lever, Any], bool], why: str
) -> SearchSpace:
    """`space` with each searched lever's `refused` values left out (`_leave_out`)."""
    params = dict(space.params)
    fixed = dict(space.fixed)
    notes = list(space.notes)
    for name, spec in space.params.items():
        item = LEVERS.get(name)
        if item is None or not isinstance(spec, Choice):
            continue
        kept = tuple(v for v in spec.values if not refused(item, v))
        if kept and kept != spec.values:
            _leave_out(params, fixed, notes, space.name, item, spec, kept, why)
    return dataclasses.replace(space, params=params, fixed=fixed, notes=tuple(notes))


def _leave_out(
    params: dict[str, Spec],
    fixed: dict[str, Any],
    notes: list[str],
    space: str,
    item: Lever,
    spec: Choice,
    kept: tuple[Any, ...],
    why: str,
) -> None:
    """`item` searched over `kept` (some of `spec`'s values) only. Left with its default alone,
    a built-in space's lever leaves the search without a note: the space a study stores is then
    the one it stored before the lever was offered, and the study resumes. Otherwise it is
    searched over `kept` or fixed to the one it keeps, with a note naming the values left out
    and `why` (a space of one's own names what it asked for)."""
    if kept == (item.default,) and space in BUILTIN_SPACES:
        del params[item.name]
        return
    left_out = ", ".join(str(v) for v in spec.values if v not in kept)
    notes.append(f"{item.name} {left_out} left out: {why}")
    if len(kept) == 1:
        del params[item.name]
        fixed[item.name] = kept[0]
    else:
        params[item.name] = Choice(values=kept)


def without_inert_levers(space: SearchSpace) -> SearchSpace:
    """`space` without the searched levers that do nothing under its fixed settings alone
    (`Lever.inert`: the compiled loss where `compile_scope` is fixed to `model`, as for a model
    without repeated blocks): each draw of another value would run the default's config again.
    Left out without a note, as `without_model_refusals` leaves out a default alone."""
    params = dict(space.params)
    for name in space.params:
        item = LEVERS.get(name)
        if item is not None and item.inert is not None and _inert_here(item.inert, space):
            del params[name]
    if params == space.params:
        return space
    return dataclasses.replace(space, params=params)


def _inert_here(rule: Callable[[Callable[[str], Any]], bool], space: SearchSpace) -> bool:
    """Whether `rule` holds on `space`'s fixed settings (the rest at their defaults) without
    reading a searched one, whose draws could make it false."""
    read_searched = False

    def get(other: str) -> Any:
        nonlocal read_searched
        read_searched = read_searched or other in space.params
        return space.fixed.get(other, LEVERS[other].default)

    return rule(get) and not read_searched


AUTO_GPU_SPACE = "auto"
"""The name of what `auto` means on a GPU: `compile` without max-autotune."""
SCALE_SPACE = "scale"
"""The name of what `auto` means on a GPU for a model of SCALE_PARAMS parameters or more."""


def compile_space(*, autotune: bool = True, auto: bool | None = None) -> SearchSpace:
    """`full` plus the compiler levers: `torch.compile` of the model (none, default,
    max-autotune-no-cudagraphs, reduce-overhead) and the optimizer implementation (as-built,
    foreach, fused). Combinations the harness refuses (a whole-step graph over reduce-overhead's
    own graphs) fail as trials with the harness's reason, and are never measured.

    A new study starts from the lever corners (`tuner.search.proposing.stages`), so a budget of
    trials that each cost a compile goes to the levers first.

    autotune=False is the default on a GPU (`auto`): max-autotune-no-cudagraphs left out. Its
    trials benchmark kernel candidates while compiling: one took 290 s on convnet small on an
    H100 (docs/benchmarks/raw/peers-h100-2026-11-23/peers-convnet.log), against 3-85 s for the
    other trials of those jobs, and it was never the recommendation.
    """
    full = full_space()
    modes = COMPILE_MODES
    return SearchSpace(
        # `auto` (what a default run searches, and its default budget) with or without autotune.
        name=AUTO_GPU_SPACE if (not autotune if auto is None else auto) else "compile",
        params={
            **full.params,
            "compile": Choice(
                values=modes if autotune else tuple(m for m in modes if "autotune" not in m)
            ),
            "optimizer": Choice(values=("as-built", "foreach", "fused")),
        },
        fixed=dict(full.fixed),
    )


AUTOTUNE_TRAIN_STEPS = 20_000
"""The planned run (`--train-steps`) from which `auto` searches max-autotune-no-cudagraphs too.
Its compile cost up to 290 s more than mode default (convnet small, H100); a kernel 2 % faster
on a 0.4 s step (a 1B decoder) saves 8 ms a step, about 36,000 steps to pay that back, on a 20 ms
step 725,000. Below 20,000 steps it can pay back only where its gain is far larger than that."""


def autotune_pays(train_steps: int | None) -> bool:
    """Whether a run of `train_steps` is long enough to search max-autotune. The search then
    only offers it: the final round ranks by setup plus `train_steps` steps
    (`recommend._for_run_length`), so it is recommended only where its measured compile time is
    paid back over that run."""
    return train_steps is not None and train_steps >= AUTOTUNE_TRAIN_STEPS


def scale_space() -> SearchSpace:
    """For models of 0.3-8B parameters: the memory-for-compute levers on a compiled step.

    Searched: what to compile as a unit (the whole model or each repeated block), activation
    checkpointing (none, selective, full) and the share of blocks it covers, and the micro-batches
    each step's batch is split into; a whole-step CUDA graph by the second stage alone (1.04x at
    0.46B, 1.01x at 1.1B: `tuner.search.spaces.staged`). Fixed: `torch.compile` (mode default),
    fused optimizer, the corners' feed (two streams, event sync every 10 steps, two batches
    prefetched from pinned memory) with batches made in two DataLoader workers.

    Two workers, as the loop users write: a batch made on the loop's own thread starved the GPU.
    On four H100s of one host, each lane tuning a 0.4-1.1B decoder on the token stream (made
    when read, docs/data.md), the loop with no workers ran 1.07x (1.1B, 16 x 2048) to 2.4x
    (0.4B) slower than the same compiled step fed by two workers, its windows spread over 2x,
    and the search's screens misjudged float8 by as much (docs/benchmarks/README.md).
    A config that runs out of memory is a failed trial with what it asked for; the job goes on.
    """
    return SearchSpace(
        name=SCALE_SPACE,
        params={
            "compile_scope": Choice(values=("blocks", "model")),
            "activation_checkpointing": Choice(values=("none", "selective", "blocks")),
            "checkpoint_share": Choice(values=(1.0, 0.5, 0.25)),
            "micro_batches": Choice(values=(1, 2, 4)),
            "cuda_graph": Choice(values=(False, True)),
            **offered(),
        },
        fixed={
            "compile": "default",
            "optimizer": "fused",
            "num_streams": 2,
            "sync_mode": "event",
            "sync_interval": 10,
            "prefetch_depth": 2,
            "pin_memory": True,
            "non_blocking": True,
            "num_workers": 2,
        },
    )


BLOCK_LEVERS: dict[str, Any] = {
    "compile_scope": "model",
    "activation_checkpointing": "none",
    "checkpoint_share": 1.0,
}
_NO_BLOCKS_NOTE = (
    "block levers (compile_scope, activation_checkpointing) fixed off: the model has no repeated "
    "blocks; declare them with Workload(blocks=...) to search them"
)


def without_block_levers(space: SearchSpace) -> SearchSpace:
    """`space` with the levers that need repeated blocks pinned off (with a note), for a model
    that has none: they would only fail as trials. One pinned on (`--fix
    activation_checkpointing=blocks`) is refused: every trial failed, and the job had then
    recommended a baseline that ignored the pin."""
    for field, off in BLOCK_LEVERS.items():
        pinned = space.fixed.get(field, off)
        if pinned != off and field != "checkpoint_share":
            raise SpaceError(
                field,
                pinned,
                f"{off!r} for this model: it has no repeated blocks to wrap; declare them with "
                "Workload(blocks=...)",
            )
    searched = [field for field in BLOCK_LEVERS if field in space.params]
    if not searched:
        return space
    return dataclasses.replace(
        space,
        params={f: s for f, s in space.params.items() if f not in BLOCK_LEVERS},
        fixed={**space.fixed, **{f: BLOCK_LEVERS[f] for f in searched}},
        notes=(*space.notes, _NO_BLOCKS_NOTE),
    )


def _without_graph_on_cpu(space: SearchSpace) -> SearchSpace:
    """Drop cuda_graph from the search (fixed false, with a note); a required graph is an error.

    reduce-overhead (Inductor's CUDA graphs) is dropped from a searched `compile` likewise.
    """
    if space.fixed.get("cuda_graph") is True:
        raise SpaceError("cuda_graph", True, _CPU_GRAPH_ALLOWED)
    pinned = space.fixed.get("compile")
    if isinstance(pinned, str) and records_graphs(pinned):
        raise SpaceError("compile", pinned, _CPU_REDUCE_ALLOWED)
    params = dict(space.params)
    fixed = dict(space.fixed)
    notes = list(space.notes)
    compile_spec = params.get("compile")
    if isinstance(compile_spec, Choice) and any(map(records_graphs, compile_spec.values)):
        kept = tuple(v for v in compile_spec.values if not records_graphs(v))
        if not kept:
            raise SpaceError("compile", list(compile_spec.values), _CPU_REDUCE_ALLOWED)
        params["compile"] = Choice(values=kept)
        notes.append(_CPU_REDUCE_NOTE)
    spec = params.get("cuda_graph")
    if spec is not None:
        if isinstance(spec, Choice) and False not in spec.values:
            raise SpaceError("cuda_graph", list(spec.values), _CPU_GRAPH_ALLOWED)
        pin_off(space, params, fixed, notes, _CPU_GRAPH_NOTE)
    _without_refused(params, fixed, notes, space.name, "cpu")
    return dataclasses.replace(space, params=params, fixed=fixed, notes=tuple(notes))


def _without_refused(
    params: dict[str, Spec], fixed: dict[str, Any], notes: list[str], space: str, device: str
) -> None:
    """Every other lever's values that its `refuse_on` refuses on `device`: a pinned one is a
    SpaceError, searched ones are left out (`_leave_out`)."""
    for name, item in LEVERS.items():
        why = item.refusal(fixed[name], device) if name in fixed else None
        if why is not None:
            # What runs here first ("allowed" had been followed by the refusal's own sentence).
            runs = tuple(repr(v) for v in item.values() if item.refusal(v, device) is None)
            raise SpaceError(name, fixed[name], f"{one_of(runs)} on {device}: {why}")
        spec = params.get(name)
        if not isinstance(spec, Choice):
            continue
        kept = tuple(v for v in spec.values if item.refusal(v, device) is None)
        if kept == spec.values:
            continue
        if not kept:
            raise SpaceError(name, list(spec.values), f"a value that runs on {device}")
        _leave_out(params, fixed, notes, space, item, spec, kept, f"refused on {device}")


def program_space(space: SearchSpace, program: Program, chosen: Collection[str]) -> SearchSpace:
    """`space` cut to the settings `program` implements: every other setting is fixed to its
    default (what the program does anyway), or, for a lever module's lever (not a `LoopConfig`
    field, at its default when absent), left out, so a study stored before the space offered it
    resumes. A setting the user chose (`chosen`, `user_fixed`: a pin, or what their own space
    fixes) to anything else is a SpaceError naming it; one a named space fixes (every named space
    fixes non_blocking=True) goes back to its default like the searched ones."""
    refused = program.lacking({f: v for f, v in space.fixed.items() if f in chosen})
    if refused is not None:
        raise SpaceError(*refused)
    defaults = LoopConfig().to_dict()
    fields = {field.name for field in dataclasses.fields(LoopConfig)}
    params = {f: spec for f, spec in space.params.items() if f in program.settings}
    dropped = [f for f in space.params if f not in program.settings and f in fields]
    kept = {
        f: value if f in program.settings or f not in fields else defaults[f]
        for f, value in space.fixed.items()
    }
    fixed = {**kept, **{f: defaults[f] for f in dropped}}
    notes = space.notes
    if dropped and not params:
        # Why the space is refused (`check_left`): "none of them applies here" had not said the
        # program implements none of them. Only then: a note is part of the stored space, and a
        # program's study stored before it must resume.
        said = ", ".join(program.settings) or "no LoopConfig field (its registry entry's settings)"
        notes = (
            *notes,
            f"{', '.join(dropped)} left out: program {program.name!r} implements {said}",
        )
    return dataclasses.replace(space, params=params, fixed=fixed, notes=notes)


def user_fixed(spec: str | Mapping[str, Any], fix: Sequence[str] | Mapping[str, Any]) -> set[str]:
    """The settings the user fixed: pinned (`--fix`, a job's `fix`) or fixed by their own space."""
    own = own_space(spec)
    pins = pins_from_mapping(fix) if isinstance(fix, Mapping) else parse_fix(fix)
    return set(pins) | (set(own.fixed) if own is not None else set())


def load_space(
    spec: str | Mapping[str, Any],
    *,
    fix: Sequence[str] | Mapping[str, Any] = (),
    cuda: bool = True,
    parameters: int | None = None,
    train_steps: int | None = None,
) -> SearchSpace:
    """The space `spec` names or gives ("streams", "full", a .json path, or a mapping), pinned.

    `auto`: on a CPU `full`; on a GPU `scale` for a model of at least SCALE_PARAMS trainable
    `parameters`, else `compile`, with max-autotune only for a planned run of at least
    AUTOTUNE_TRAIN_STEPS `train_steps` (`autotune_pays`).

    Each pin ("name=value" strings, see `parse_fix`, or a mapping of typed values) takes its
    setting out of the search and pins it, whatever the space said. With `cuda=False`,
    cuda_graph is taken out of the search and fixed to false (with a note); cuda_graph pinned or
    fixed to true is then a SpaceError.
    """
    own = own_space(spec)
    if own is not None:
        space = own
    elif spec == "auto":
        if not cuda:
            space = full_space()
        elif parameters is not None and parameters >= SCALE_PARAMS:
            space = scale_space()
        else:
            space = compile_space(autotune=autotune_pays(train_steps), auto=True)
    elif spec == "scale":
        space = scale_space()
    elif spec == "streams":
        space = streams_space()
    elif spec == "full":
        space = full_space()
    elif spec == "compile":
        space = compile_space()
    else:
        raise SpaceError("space", spec, _SPACE_ALLOWED)
    pins = pins_from_mapping(fix) if isinstance(fix, Mapping) else parse_fix(fix)
    if pins:
        space = dataclasses.replace(
            space,
            params={field: s for field, s in space.params.items() if field not in pins},
            fixed={**space.fixed, **pins},
        )
    if not cuda:
        searched = sorted(space.params)
        space = _without_graph_on_cpu(space)
        if searched and not space.params:  # else every trial runs the plain default, unsaid
            why = "; ".join(space.notes) or "none of these runs without a CUDA device"
            raise SpaceError("space", searched, f"a space with a setting a CPU searches ({why})")
    return space


# --------------------------------------------------------------------------------------------
# --fix pins
# --------------------------------------------------------------------------------------------
