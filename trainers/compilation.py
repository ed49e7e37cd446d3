"""`torch.compile` in a run, and what compiling cost: seconds, graphs, graph breaks, cache hits.

Compilation is a cost paid once per run (per process, with a cold cache), so it is measured on
its own and kept out of the timed windows: the warm-up steps during which Dynamo compiled are
timed with a device sync at both ends, and `compile_s` is what they took beyond a normal step
(the median step of the timed windows). CUDA-graph capture and cudagraph-tree recording are not
compilation and are not counted.

Inductor keeps compiled artefacts on disk (FX graphs, kernels) under TORCHINDUCTOR_CACHE_DIR,
its own variable (default: a per-user folder in the temp dir). Processes that share the folder
share the artefacts: a later run of the same model and mode reads them back (cache hits) instead
of compiling again. `compile_cache_dir(path)` sets the folder for the runs inside it.

A run starts with a fresh Dynamo (`CompileWatch`), except after a run of the same model build,
arithmetic, precision and process settings (`reuse_key`): that one keeps what the last compiled.
At 1B a whole-model float8 compile costs 40 s even when every graph comes from the disk cache;
the tuner's final round runs the config its trial just ran, and the gate runs a config after its
eager twin, which compiles the same graphs. Within `keeping_compiled`, a few keys keep their code
side by side: the final round takes turns between configs of other arithmetic (the kept code's
state is `trainers.kept_code`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import cast

import torch
from torch import nn

from trainers import cache_key, dynamo_state
from trainers.config import CompileMode, LoopConfig
from trainers.dynamo_state import counters as _counters
from trainers.dynamo_state import first_line as _first_line
from trainers.dynamo_state import graph_breaks as _graph_breaks
from trainers.dynamo_state import graphs as _graphs
from trainers.dynamo_state import guard_failures as _guard_failures
from trainers.dynamo_state import limit_hit as _limit_hit
from trainers.dynamo_state import recompile_reasons as _recompile_reasons
from trainers.kept_code import (
    KEPT,
    ReuseKey,
    start_fresh,
)
from trainers.levers import LEVERS, Option, defaults_where, records_graphs

CACHE_DIR_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"

# Before any compile of this process: its FX-graph keys must not depend on what it imported
# first, or a child process misses what the measuring process wrote (`trainers.cache_key`).
cache_key.register()


def usable_cores() -> int:
    """The cores this process may run on: its CPU affinity, as Inductor counts them for its
    compile workers (a cpuset limits it, a CPU quota does not)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def user_cache_dir() -> str | None:
    """TORCHINDUCTOR_CACHE_DIR where someone chose it; None where it is unset or holds Inductor's
    own default. Inductor writes that default into the variable the first time anything imports
    its config (`torch._inductor.config`: torchao's float8 does, before a compile), so a value
    set in this process is not, by itself, the user's choice."""
    value = os.environ.get(CACHE_DIR_VARIABLE)
    if not value:
        return None
    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # another torch's layout: take the variable as it is
        return value
    return None if os.path.abspath(value) == os.path.abspath(default_cache_dir()) else value


COMPILE_WARMUP_STEPS: dict[str, int] = {
    str(option.value): option.warmup_steps for option in LEVERS["compile"].options
}
"""Warm-up steps a compile mode needs before its steps are steady (the lever table's, where the
reasons are); compiling the optimizer (optimizer="compiled") needs one."""

_MAX_NOTES = 8

NOTHING_COMPILED = (
    "nothing compiled: Dynamo, fresh for this run, compiled no graph in it, "
    "so its code ran eagerly (as a function in a file Dynamo skips does)"
)
"""The note of a compiling run that ran eagerly: its speed is not the compiler's."""

RECOMPILE_LIMIT_HIT = (
    "Dynamo's recompile limit was hit: a function it had compiled before ran eagerly from then "
    "on, so part of this run's speed is not the compiler's"
)
"""The note of a run in which Dynamo gave up compiling a function again (its recompile limit,
8 entries a function by default): no error is raised, and no fresh-Dynamo check sees it where
the run kept code from earlier runs."""


_COMPILING = ("compile", "autotune", "compile+record")


def _module_options(config: LoopConfig) -> list[Option]:
    """The options a config sets for the levers declared in modules of their own."""
    return [LEVERS[name].option(value) for name, value in config.modules]


def compiles(config: LoopConfig) -> bool:
    """Whether a run of `config` compiles anything with torch.compile (a lever module's value
    that costs a compile, such as `loss='compiled'`, too)."""
    return (
        config.compile != "none"
        or config.optimizer == "compiled"
        or any(option.cost in _COMPILING for option in _module_options(config))
    )


def min_warmup_for_compile(config: LoopConfig) -> int:
    """The fewest warm-up steps that keep compilation out of the timed windows."""
    return max(
        COMPILE_WARMUP_STEPS[config.compile],
        LEVERS["optimizer"].option(config.optimizer).warmup_steps,
        *(option.warmup_steps for option in _module_options(config)),
    )


def compile_model(model: nn.Module, mode: CompileMode) -> nn.Module:
    """`model` wrapped by `torch.compile(model, mode=mode)`, or `model` itself for "none".

    The wrapper shares the model's parameters; the workload's own module is left uncompiled, so a
    later run of it under another config starts from an eager model.
    """
    if mode == "none":
        return model
    return cast(nn.Module, torch.compile(model, mode=mode))


@contextlib.contextmanager
def compile_cache_dir(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Point Inductor's on-disk caches at `path` for the block; the previous setting comes back.

    Runs in several processes that use one folder share compiled artefacts (a warm cache makes
    `compile_s` smaller and shows up as `RunResult.compile_cache_hits`). Set the variable before
    the first compile of the process to cover the whole process instead.
    """
    folder = Path(path).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    previous = os.environ.get(CACHE_DIR_VARIABLE)
    os.environ[CACHE_DIR_VARIABLE] = str(folder)
    try:
        yield folder
    finally:
        # Inductor writes its default into the variable on first use; restore what was there.
        restore_cache_dir(previous)


def restore_cache_dir(previous: str | None) -> None:
    """TORCHINDUCTOR_CACHE_DIR set back to `previous`, as read before it was changed (None:
    unset)."""
    if previous is None:
        os.environ.pop(CACHE_DIR_VARIABLE, None)
    else:
        os.environ[CACHE_DIR_VARIABLE] = previous


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class CompileStats:
    """What compiling cost in one run (all zero / None for a run that compiles nothing)."""

    compile_s: float = 0.0
    recompiles: int = 0
    graph_breaks: int = 0
    unstable: bool = False
    notes: tuple[str, ...] = ()
    cache_hits: int | None = None
    cache_misses: int | None = None
    kept_s: float = 0.0
    """Where the run kept an earlier run's compiled code (`reuse_key`): what compiling it cost
    there, which a fresh process pays again (0 otherwise)."""


def keeps_code(config: LoopConfig) -> bool:
    """Whether a later run may keep what a run of `config` compiled (`reuse_key` says why not
    for the others)."""
    return not (
        records_graphs(config.compile)
        or config.parallel != "none"
        or config.optimizer == "compiled"
    )


def reuse_key(
    model: nn.Module,
    config: LoopConfig,
    precision: str | None,
    device: torch.device,
) -> ReuseKey | None:
    """What a run must share with the last compiling run of this process to keep its compiled
    code (`CompileWatch`): the model's class and parameters (names, shapes, dtypes: a copy of the
    same build, as the gate's runs take, shares them; another model resets), the levers that
    may change the arithmetic (a twin and its config differ only in loop settings, which compile
    the same graphs), the precision and the process's settings. None: never (a compile that
    records Inductor's CUDA graphs keeps memory pools tied to the run that recorded them; a
    data-parallel wrapper is built anew each run; a compiled optimizer step marks the
    parameters and its state as static addresses, which Dynamo keeps alive until it is reset,
    and guards on them, so each run's new optimizer would compile again and keep the last one's
    state). A whole-step CUDA graph (`cuda_graph`) keeps and is kept from like a step without
    one: its graph, pool and capturable optimizer belong to the run's step
    (`trainers.step.GraphStep`), while Dynamo holds only the compiled model's code, which the
    capture records as it would launch it (the same graphs: at the Qwen2-style shape on an H200
    the graph's trial compiled in 45 s from the disk cache its leader had filled in 118 s,
    2026-12-04).
    Dynamo's guards still decide whether the code applies: the key only decides whether the
    earlier entries are dropped first."""
    if not keeps_code(config):
        return None
    numerics = {name: config.get(name) for name in defaults_where("equivalence")}
    apart = {name for name in numerics if LEVERS[name].around_forward is not None}
    apart.add("micro_batches")  # the batch each forward takes: its shapes
    return ReuseKey(
        guarded=(
            tuple(sorted((k, v) for k, v in numerics.items() if k not in apart)),
            precision,
            str(device),
            torch.are_deterministic_algorithms_enabled(),
            torch.get_float32_matmul_precision(),
        ),
        unguarded=(
            type(model),
            tuple((name, tuple(p.shape), p.dtype) for name, p in model.named_parameters()),
            tuple(sorted((k, v) for k, v in numerics.items() if k in apart)),
            # A run pointed at another cache folder (`compile_cache_dir`) asked for its own
            # compile (the user's choice: Inductor writes its own default into the variable at
            # first use).
            user_cache_dir(),
        ),
    )


def holds_compiled(
    model: nn.Module, config: LoopConfig, precision: str | None, device: torch.device
) -> bool:
    """Whether this process's Dynamo still holds the code an earlier run of `config` compiled on
    a copy of `model` (its `reuse_key` kept and nothing compiled since): a run of it here then
    compiles nothing where Dynamo's guards pass."""
    return why_not_held(model, config, precision, device) is None


_GUARDED = (
    "the numerics' levers",
    "the precision",
    "the device",
    "determinism",
    "matmul precision",
)
_UNGUARDED = ("the model's class", "its parameters", "a lever around the forward", "cache folder")


def why_not_held(
    model: nn.Module, config: LoopConfig, precision: str | None, device: torch.device
) -> str | None:
    """Why `holds_compiled` is false, in words (None: it holds): the config compiles nothing or
    keeps no code, the code of its key was dropped (and the note why), something compiled since,
    or the kept keys differ from its key (in which of `ReuseKey`'s parts)."""
    if not compiles(config):
        return "the config compiles nothing"
    key = reuse_key(model, config, precision, device)
    if key is None:
        return "the config keeps no compiled code"
    if key not in KEPT.code:
        if key in KEPT.lost:
            return f"its code was dropped: {KEPT.lost[key]}"
        if not KEPT.code:
            return "no code is kept"
        other = next(iter(KEPT.code))
        parts = [
            name
            for names, mine, theirs in (
                (_GUARDED, key.guarded, other.guarded),
                (_UNGUARDED, key.unguarded, other.unguarded),
            )
            for name, a, b in zip(names, mine, theirs, strict=False)
            if a != b
        ]
        return f"the code kept is of another key (it differs in {', '.join(parts) or '?'})"
    if KEPT.graphs != _graphs():
        return f"something compiled since ({_graphs()} graphs, {KEPT.graphs} when it was kept)"
    return None


class CompileWatch:
    """Counts what Dynamo and Inductor do during a run and times the warm-up steps that compile.

    Inactive (a config that compiles nothing), every method is a no-op and `finish()` returns
    the empty CompileStats. `reuse`: the run's `reuse_key`.
    """

    def __init__(
        self, device: torch.device, *, active: bool, reuse: ReuseKey | None = None
    ) -> None:
        self.device = device
        self.active = active
        self._reuse = reuse
        self._kept_s = 0.0
        self._kept = False  # kept the code of an earlier run of its key
        self._fresh = False  # began with a fresh Dynamo: nothing it runs was compiled before
        self._failures: dict[object, int] = {}
        self._compiling_s: list[float] = []
        self._graphs_after_first = 0
        self._graphs_after_warmup = 0
        self._breaks_after_warmup = 0
        self._graphs_at_start = 0
        self._dropped: str | None = None  # why this run dropped code kept for reuse
        if active:
            # A fresh Dynamo, as in a new process: earlier runs in this process compiled the same
            # code objects (the model class's forward, the optimizer's step), and their cache
            # entries count against Dynamo's recompile limit; past it, Dynamo runs the frame
            # eagerly without an error and a "compiled" config would be measured eager. It also
            # makes compile_s the cost of this run's compilation, not of the first run's.
            # Inductor's on-disk caches survive (they are reported as cache hits). Kept after a
            # run of the same key (module doc): where its guards pass, nothing compiles and
            # compile_s is 0 (kept_s says what the code cost). Also kept after someone else's
            # torch._dynamo.reset() with nothing compiled since: it then compiles again.
            # Within `keeping_compiled`, a new key compiles beside the kept ones while they fit.
            kept = KEPT
            fits = reuse is not None and (
                reuse in kept.code
                or (
                    len(kept.code) < kept.limit
                    and all(key.unguarded == reuse.unguarded for key in kept.code)
                )
            )
            # A limit hit since the last run (outside any watched run) leaves a function that
            # Dynamo compiles no more until a reset.
            hit = any(_limit_hit(reason) for reason in _counters()["unimplemented"])
            if reuse is None or not fits or kept.graphs != _graphs() or hit:
                self._dropped = start_fresh(kept, reuse, hit)
                self._fresh = True
            else:
                self._kept = reuse in kept.code
                self._kept_s = kept.code.get(reuse, 0.0)
                if not self._kept and reuse in kept.lost:
                    # Beside the kept keys, this one compiles again because a run dropped its
                    # code earlier: said here too (2026-12-02: a final-round turn compiled 47 s
                    # beside its tied rival, and nothing said why).
                    self._dropped = f"{kept.lost.pop(reuse)} (at an earlier run's start)"
            if kept.base is not None:
                # Dynamo's limit counts every key's entries on a code object: this run may add as
                # many of its own as a run alone could, beside the other kept keys' (one entry a
                # graph at most, counted over all functions: where theirs are spread over several,
                # a little more). Alone it is Dynamo's own: a config that hits it alone, hits it.
                others = sum(n for key, n in kept.graphs_of.items() if key != reuse)
                torch._dynamo.config.recompile_limit = kept.base + others
            self._failures = {code: len(r) for code, r in _guard_failures().items()}
            kept.graphs = None  # until this run ends: a failed one leaves nothing to reuse
            _counters().clear()
            self._graphs_at_start = _graphs()

    def _sync(self) -> None:
        if self.device.type == "cuda":
            # Device sync: the step's time includes all its work, and none of an earlier step's.
            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def warmup_step(self) -> Iterator[None]:
        """Time one warm-up step; kept if Dynamo compiled a graph during it."""
        if not self.active:
            yield
            return
        graphs = _graphs()
        self._sync()
        started = time.perf_counter()
        yield
        self._sync()
        elapsed = time.perf_counter() - started
        if _graphs() > graphs:
            if not self._compiling_s:
                self._graphs_after_first = _graphs()
            self._compiling_s.append(elapsed)

    def end_warmup(self) -> None:
        if self.active:
            self._graphs_after_warmup = _graphs()
            self._breaks_after_warmup = _graph_breaks()

    def finish(self, step_ms: list[float]) -> CompileStats:
        """The run's CompileStats; `step_ms` are the step times of the timed windows."""
        if not self.active:
            return CompileStats()
        normal_s = statistics.median(step_ms) / 1e3 if step_ms else 0.0
        compile_s = sum(max(0.0, s - normal_s) for s in self._compiling_s)
        limit_hit = any(_limit_hit(reason) for reason in _counters()["unimplemented"])
        if limit_hit:
            # Past the limit Dynamo compiles the function no more until a reset: a run kept
            # beside this one would run it eagerly, and nothing would say so.
            KEPT.clear(f"{dynamo_state.DROPPED}: Dynamo's recompile limit was hit in a run")
        elif self._kept and self._compiling_s:
            # A kept run that compiled anyway (a guard failed) is not kept from: its entries
            # would pile up toward Dynamo's recompile limit, one more each run. Logged: the
            # next run compiles again too, and the guard is what to fix.
            dynamo_state.compiled_although_kept(_recompile_reasons(self._failures))
        elif self._reuse is not None:
            KEPT.code[self._reuse] = max(compile_s, self._kept_s)
            # Its entries add up: a kept run that compiled (in its windows) adds to the earlier.
            own = _graphs() - self._graphs_at_start
            KEPT.graphs_of[self._reuse] = KEPT.graphs_of.get(self._reuse, 0) + own
            KEPT.graphs = _graphs()
        graphs, breaks = _graphs(), _graph_breaks()
        in_windows = graphs - self._graphs_after_warmup
        breaks_in_windows = breaks - self._breaks_after_warmup
        notes: list[str] = [] if self._dropped is None else [self._dropped]
        if in_windows or breaks_in_windows:
            notes.append(
                f"{in_windows} graph(s) compiled and {breaks_in_windows} graph break(s) met "
                "during the timed windows: their steps include compilation"
            )
        if not graphs and self._fresh:
            notes.append(NOTHING_COMPILED)
        if limit_hit:
            notes.append(RECOMPILE_LIMIT_HIT)
        notes += [f"graph break: {_first_line(reason)}" for reason in _counters()["graph_break"]]
        notes += [
            f"recompile: {_first_line(reason)}" for reason in _recompile_reasons(self._failures)
        ]
        inductor = _counters()["inductor"]
        return CompileStats(
            compile_s=compile_s,
            # Graphs compiled after the first step that compiled: a guard failed (or a new
            # code path was met) and Dynamo compiled again.
            recompiles=graphs - self._graphs_after_first if self._compiling_s else 0,
            graph_breaks=breaks,
            unstable=bool(in_windows or breaks_in_windows),
            notes=tuple(notes[:_MAX_NOTES]),
            cache_hits=inductor["fxgraph_cache_hit"],
            cache_misses=inductor["fxgraph_cache_miss"],
            kept_s=self._kept_s,
        )
