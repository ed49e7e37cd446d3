"""How much of a data-parallel step's communication the GPU hid under compute, from a profile's
Chrome trace: the figure Holistic Trace Analysis calls comm-comp overlap.

NCCL runs each collective (DDP's bucketed all-reduces, FSDP2's all-gathers and reduce-scatters)
as a kernel on a stream of its own; whatever part of that kernel's time no compute kernel runs
beside is time the step waits for the network. In the trace's microseconds, over the profiled
region:
- comm = the union of the communication kernels' intervals (a kernel named `nccl...`);
- compute = the union of every other kernel's intervals;
- exposed = comm minus compute (interval subtraction: `tuner.evidence.intervals`);
- exposed fraction = |exposed| / |comm| (HTA's overlap is 1 minus it).
A copy or memset is neither: it neither hides communication nor is one.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from tuner.evidence.intervals import Interval, intersect, merge, subtract, total

COMM_MARK = "nccl"
"""Kernels whose name holds this (any case) are communication: `ncclDevKernel_AllReduce_...`,
`ncclKernel_AllGather_...`, `ncclDevKernel_ReduceScatter_...`."""


def is_communication(event: Mapping[str, Any]) -> bool:
    return COMM_MARK in str(event.get("name", "")).lower()


def _spans(events: Iterable[Mapping[str, Any]], region: Interval) -> list[Interval]:
    spans = ((float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events)
    return intersect(merge(spans), [region])


def collective_name(events: Iterable[Mapping[str, Any]]) -> str:
    """What to call the communication in words: all-reduce when every kernel is one."""
    names = [str(e.get("name", "")).lower() for e in events]
    return "all-reduce" if names and all("allreduce" in n for n in names) else "communication"


def communication(
    kernels: Sequence[Mapping[str, Any]], region: Interval, steps: int
) -> dict[str, Any]:
    """The communication figures of `kernels` (the trace's kernel events) over `region`:
    `comm_ms_per_step`, `comm_exposed_ms_per_step` and `comm_exposed_fraction` (None without
    communication), and `comm_kind` ("all-reduce" or "communication")."""
    comm_events = [e for e in kernels if is_communication(e)]
    comm = _spans(comm_events, region)
    compute = _spans((e for e in kernels if not is_communication(e)), region)
    exposed = subtract(comm, compute)
    comm_us = total(comm)
    return {
        "comm_ms_per_step": comm_us / steps / 1e3 if comm_events else None,
        "comm_exposed_ms_per_step": total(exposed) / steps / 1e3 if comm_events else None,
        "comm_exposed_fraction": total(exposed) / comm_us if comm_us > 0 else None,
        "comm_kind": collective_name(comm_events) if comm_events else None,
    }
