"""The compiled code this process keeps for reuse between runs, and compiles that leave it alone.

`trainers.compilation.CompileWatch` starts each compiling run with a fresh Dynamo, as a new
process would, except where the run may keep what an earlier run compiled (its `ReuseKey`): a
whole-model float8 compile at 0.5B costs 45-60 s even from a warm disk cache, against about
10 s on kept code. `KEPT` is that state; `keeping_compiled` lets a few keys keep code side by
side (the search's trials, the final round's turns).

Anything else that compiles in between (a lever's probe) moves Dynamo's graph count, and the
next run cannot tell its entries from the kept keys': it starts fresh. A compile on a code
object of its own (`compile_apart`) adds nothing to the code objects the runs use, so it keeps
the kept code: on an H200 (2026-12-02, Qwen1.5-0.5B in float8) the `float8_linears` probe after
the leader's trial reset Dynamo, and the leader compiled again in the gate (166 s) and in the
final round (47 s).
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

from trainers import dynamo_state
from trainers.dynamo_state import graphs as _graphs


@dataclasses.dataclass(frozen=True)
class ReuseKey:
    """A run's `reuse_key`. `guarded`: what Dynamo's guards tell apart without changing what
    either compiles (module types, autocast, determinism, the matmul precision), so keys that
    differ only there may keep their code side by side (`keeping_compiled`). `unguarded`: what
    keys must share to sit side by side: a lever's context around the forward (the SDPA
    backend, which Inductor bakes into the graph and no guard checks); the shapes the graphs
    take (the model's parameters, the micro-batches): one that differs fails a guard, and Dynamo
    then compiles it with dynamic sizes, code a fresh process would not run, until it is reset;
    and the cache folder asked for."""

    guarded: tuple[object, ...]
    unguarded: tuple[object, ...]


@dataclasses.dataclass
class _Kept:
    """The compiled code Dynamo holds now, by `reuse_key`: what each key's code cost to compile,
    and Dynamo's graph count when the last of them ended (None: nothing kept, or a run that
    compiled began since). A count that moved means something else compiled in between: reset.
    `limit`: how many keys may keep code side by side (`keeping_compiled`); 1 outside it.
    `graphs_of`: the graphs each kept key compiled, what its entries add on Dynamo's code objects.
    `base`: Dynamo's recompile limit when the outermost `keeping_compiled` began (None outside).
    `lost`: keys whose code a run dropped, and the note that said why: a later run of one of them
    compiles again because of it, and says so (`dynamo_state.why_dropped`)."""

    code: dict[ReuseKey, float] = dataclasses.field(default_factory=dict)
    graphs: int | None = None
    limit: int = 1
    graphs_of: dict[ReuseKey, int] = dataclasses.field(default_factory=dict)
    base: int | None = None
    lost: dict[ReuseKey, str] = dataclasses.field(default_factory=dict)

    def clear(self, why: str | None = None) -> None:
        """Drop the kept code; `why` (a note) is said again by a later run of a dropped key."""
        if why is not None:
            self.lost.update(dict.fromkeys(self.code, why))
        self.code.clear()
        self.graphs_of.clear()
        self.graphs = None


KEPT = _Kept()
"""This process's kept code (one Dynamo, one state)."""

MAX_KEPT = 6
"""The most keys `keeping_compiled` keeps side by side: the trials' three and a final round's
three finalists (`tuner.search.options.SEARCH_KEPT`, `top_k`). Each adds its entries to the same
code objects (the model's forward, each block's), and past Dynamo's recompile limit (8 a
function by default) a frame runs eagerly without an error, so a "compiled" config would be
measured eager: a run beside kept keys has the limit raised by the graphs they compiled, and a
run that hits it anyway says so (`RECOMPILE_LIMIT_HIT`) and keeps nothing."""


def forget_compiled() -> None:
    """The next compiling run starts with a fresh Dynamo whatever it shares with the last
    (`reuse_key`): as a new process would (a test of the disk cache, a benchmark of a cold
    compile)."""
    KEPT.clear()
    KEPT.lost.clear()


@contextlib.contextmanager
def keeping_compiled(keys: int) -> Iterator[None]:
    """Within: the code of up to `keys` reuse keys (at most `MAX_KEPT`) stays in Dynamo side by
    side, so runs that take turns between configs of other arithmetic (the tuner's final round:
    A, B, A, B) compile each once, not at every turn. Dynamo's guards tell their entries apart,
    as they do for one key's, and a run's recompile limit is Dynamo's own plus the graphs the
    other kept keys compiled (their entries on the same code objects). After it,
    a run of any kept key still keeps them all (at most `MAX_KEPT`), and a run of another key
    starts fresh, as outside."""
    before, outermost = KEPT.limit, KEPT.base is None
    KEPT.limit = max(1, min(keys, MAX_KEPT))
    if outermost:
        KEPT.base = int(torch._dynamo.config.recompile_limit)
    try:
        yield
    finally:
        KEPT.limit = before
        if outermost and KEPT.base is not None:
            torch._dynamo.config.recompile_limit = KEPT.base
            KEPT.base = None


def _dropped_note(kept: _Kept, reuse: ReuseKey | None, hit: bool) -> str:
    """`dynamo_state.why_dropped` for a run of key `reuse` that starts afresh beside `kept`."""
    differing = None
    if reuse is not None:
        other = next((k for k in kept.code if k.unguarded != reuse.unguarded), None)
        differing = None if other is None else (reuse.unguarded, other.unguarded)
    return dynamo_state.why_dropped(
        len(kept.code),
        keeps=reuse is not None,
        limit_was_hit=hit,
        room=kept.limit,
        kept_here=reuse in kept.code,
        unguarded=differing,
        last_kept=kept.graphs is not None,
    )


def start_fresh(kept: _Kept, reuse: ReuseKey | None, hit: bool) -> str | None:
    """Reset Dynamo and drop the kept code for a run of key `reuse`; the note that says why, where
    code was kept for reuse (now, or for this key by a run before: a fresh start costs it a
    whole compile again)."""
    dropped = None
    if kept.code:
        dropped = _dropped_note(kept, reuse, hit)
    elif reuse is not None and reuse in kept.lost:
        dropped = f"{kept.lost.pop(reuse)} (at an earlier run's start)"
    torch._dynamo.reset()
    kept.clear(dropped)
    if reuse is not None:  # this run pays for its own key's drop, and says so
        kept.lost.pop(reuse, None)
    return dropped


@contextlib.contextmanager
def compiling_apart() -> Iterator[None]:
    """Within: what compiles adds no entry to a code object a run uses (`compile_apart`), so
    code kept before stays kept (`holds_compiled` still holds, and the next run of a kept key
    compiles nothing). Only where it was kept and nothing else compiled since, and where no
    graph broke within: past a break Dynamo compiles the frames it calls on their own code
    objects, which a run may compile too (the model's loss function, a block's forward), so
    their entries would count toward that run's recompile limit unseen. The next run then
    starts fresh, as after any other compile."""
    intact = KEPT.graphs is not None and KEPT.graphs == _graphs()
    breaks = dynamo_state.graph_breaks()
    try:
        yield
    finally:
        if intact and dynamo_state.graph_breaks() == breaks:
            KEPT.graphs = _graphs()


def _call(function: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return function(*args, **kwargs)


def compile_apart(function: Callable[..., Any]) -> Callable[..., Any]:
    """`function` (a module or a function) compiled by torch.compile with static shapes, on a
    code object of its own: Dynamo keeps its entries there, not on the model's forward (which
    `torch.compile(module)` shares with every compiled module) or on a function a run compiles
    too, so no run's recompile limit counts them and the code kept for reuse stays kept
    (`compiling_apart`, around each call: the call that compiles). Static shapes: a Dynamo that
    has seen other shapes of a code object would trace this one dynamic. For a lever's probe."""
    # Globals of its own: Dynamo stores each compiled graph in the frame's globals, and only a
    # reset removes them (in this module's they would pile up, probe after probe).
    scope = {"__builtins__": builtins}
    own = types.FunctionType(_call.__code__.replace(), scope, "compiled_apart")
    compiled: Any = torch.compile(own, dynamic=False)

    def call(*args: Any, **kwargs: Any) -> Any:
        with compiling_apart():
            return compiled(function, *args, **kwargs)

    return call
