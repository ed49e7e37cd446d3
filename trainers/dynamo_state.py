"""What a compiling run reads from Dynamo's own records, and why code kept for reuse was dropped.

`trainers.compilation.CompileWatch` keeps the code of earlier runs where a run may reuse it
(`keeping_compiled`) and starts Dynamo afresh otherwise. A fresh start costs a whole compile
again (a float8 decoder of 0.5B on an H200: 45-60 s from a warm disk cache against about 10 s
kept), so a run that drops kept code says which rule dropped it (`why_dropped`, among the run's
compile notes), and a run that kept code and compiled anyway logs the guard that failed: on the
H200 (2026-12-02, Qwen1.5-0.5B, float8) every final-round turn compiled again, and nothing in
the record said why.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import cast

LOG = logging.getLogger("trainers.compilation")

DROPPED = "kept code dropped"
"""How a note of `why_dropped` begins."""

UNGUARDED_FIELDS = (
    "the model's class",
    "the model's parameters (names, shapes, dtypes)",
    "a lever around the forward (the SDPA backend) or the micro-batches",
    "the compile cache folder",
)
"""What each field of `ReuseKey.unguarded` is, in its order, as a note names it."""


def counters() -> dict[str, dict[str, int]]:
    from torch._dynamo.utils import counters as dynamo_counters

    return cast(dict[str, dict[str, int]], dynamo_counters)


def graphs() -> int:
    """Graphs Dynamo compiled since its counters were last cleared."""
    return counters()["stats"]["unique_graphs"]


def graph_breaks() -> int:
    return sum(counters()["graph_break"].values())


def limit_hit(reason: str) -> bool:
    """Whether Dynamo's record of what it could not compile (`counters["unimplemented"]`) is its
    recompile limit: "Dynamo recompile limit exceeded" in torch 2.11 to 2.13."""
    return "recompile limit" in reason.lower() or "cache_size_limit" in reason.lower()


def guard_failures() -> dict[object, list[object]]:
    """The guard failures Dynamo recorded by code object (why it recompiled), kept until it is
    reset; private to torch, so optional."""
    from torch._dynamo import utils

    failures = getattr(utils, "guard_failures", None)
    return failures if isinstance(failures, dict) else {}


def recompile_reasons(before: dict[object, int]) -> list[str]:
    """The guard failures recorded since `before` (each code object's count then): a run that
    kept earlier runs' code does not report theirs."""
    return [
        str(reason)
        for code, reasons in guard_failures().items()
        for reason in reasons[before.get(code, 0) :]
    ]


def first_line(text: str) -> str:
    """The first line of `text`, its runs of spaces made one (Dynamo pads a guard's source)."""
    line = text.strip().splitlines()[0] if text.strip() else text
    return " ".join(line.split())[:200]


def why_dropped(
    kept: int,
    *,
    keeps: bool,
    limit_was_hit: bool,
    room: int,
    kept_here: bool,
    unguarded: tuple[Sequence[object], Sequence[object]] | None,
    last_kept: bool,
) -> str:
    """The note of a run that starts Dynamo afresh while `kept` keys keep code: the first rule
    that drops it. `keeps`: the run has a reuse key; `room`: the keys that may sit side by side;
    `kept_here`: its own key is among the kept; `unguarded`: its key's unguarded fields and the
    first kept key's that differ from them (None: all alike); `last_kept`: the last compiling
    run here kept its code (else it failed, or compiled again although it ran kept code)."""
    if not keeps:
        why = (
            "this config keeps no code (Inductor's CUDA graphs, a data-parallel wrapper or a "
            "compiled optimizer)"
        )
    elif limit_was_hit:
        why = "Dynamo's recompile limit was hit since the last run"
    elif not kept_here and unguarded is not None:
        ours, theirs = unguarded
        field = next(
            (name for name, a, b in zip(UNGUARDED_FIELDS, ours, theirs, strict=False) if a != b),
            "a field no guard checks",
        )
        why = f"it differs from the kept code in {field}, which no guard of Dynamo checks"
    elif not kept_here and kept >= room:
        why = f"no room beside the {kept} kept (at most {room} side by side here)"
    elif not last_kept:
        why = (
            "the last compiling run here kept nothing (it failed, or compiled again although "
            "it ran kept code)"
        )
    else:
        why = "something else compiled in this process since the last run (a probe, another model)"
    return f"{DROPPED} ({kept} config(s)): {why}"


def compiled_although_kept(reasons: Sequence[str]) -> None:
    """Log a run that kept earlier code and compiled anyway: one of Dynamo's guards failed on
    this run's model or inputs, and the next run starts fresh (the guard is what to fix)."""
    shown = "; ".join(first_line(reason) for reason in reasons[:3]) or "no guard failure recorded"
    LOG.warning("a run on kept compiled code compiled again: %s", shown)
