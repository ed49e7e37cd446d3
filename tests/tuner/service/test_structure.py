"""The service's structure: no import cycle among its modules (the job run reaches its worker
through the `JobMember` protocol), and the job store split by client."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from tests.test_layers import ROOT, modules_imported
from tuner.service import job
from tuner.service.jobstore import JobStore, WorkerStore
from tuner.service.membership import Membership
from tuner.service.slotlocks import SlotLocks
from tuner.service.submissions import Submissions
from tuner.service.worker import Worker

SERVICE = ROOT / "tuner" / "service"


def _graph() -> dict[str, set[str]]:
    """tuner.service module -> the tuner.service modules it imports (at any depth)."""
    names = {f"tuner.service.{p.stem}" for p in SERVICE.glob("*.py") if p.stem != "__init__"}
    return {
        f"tuner.service.{path.stem}": {m for m in modules_imported(path) if m in names}
        for path in SERVICE.glob("*.py")
        if path.stem != "__init__"
    }


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    found: list[list[str]] = []

    def visit(node: str, path: list[str]) -> None:
        for nxt in sorted(graph.get(node, ())):
            if nxt in path:
                found.append([*path[path.index(nxt) :], nxt])
            elif len(path) < len(graph):
                visit(nxt, [*path, nxt])

    for start in sorted(graph):
        visit(start, [start])
    return found


def test_no_service_module_imports_one_that_imports_it_back() -> None:
    graph = _graph()
    assert "tuner.service.job" in graph["tuner.service.worker"]  # the worker runs jobs
    assert "tuner.service.worker" not in graph["tuner.service.job"]
    assert _cycles(graph) == []


def test_the_cycle_finder_sees_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()})[0] == ["a", "b", "c", "a"]


def test_the_job_run_uses_only_what_the_member_protocol_declares() -> None:
    """Every `self.worker.X` of `JobRun` is a member of `JobMember`, and `Worker` has them all."""
    used = set(re.findall(r"self\.worker\.(\w+)", inspect.getsource(job.JobRun)))
    declared = {name for name in vars(job.JobMember) if not name.startswith("_")}
    assert {"store", "options_for", "beat_in"} <= used <= declared, used - declared
    worker = inspect.getsource(Worker)
    has = set(re.findall(r"self\.(\w+)\s*[:=][^=]", worker)) | set(dir(Worker))
    assert declared <= has, declared - has


def test_the_job_store_is_split_by_client() -> None:
    worker_side = {"claim", "join", "leave", "heartbeat", "progress", "finish", "requeue_stale"}
    api_side = {"create", "list", "cancel", "best_for", "counts_by_status", "trial_stats"}
    slot_side = {"lock_slots", "unlock_slots"}
    assert api_side <= set(dir(Submissions))
    assert not (worker_side | slot_side) & set(dir(Submissions))
    assert worker_side <= set(dir(Membership)) and not (api_side | slot_side) & set(dir(Membership))
    assert slot_side <= set(dir(SlotLocks)) and not (api_side | worker_side) & set(dir(SlotLocks))
    assert not api_side & set(dir(WorkerStore))  # a worker cannot submit or cancel
    assert (api_side | worker_side | slot_side) <= set(dir(JobStore))  # the facade has it all


def test_the_api_holds_only_the_submissions_side() -> None:
    api = [p for p in (ROOT / "api").rglob("*.py")]
    importing = {
        str(Path(p).relative_to(ROOT)): modules_imported(p)
        for p in api
        if {"tuner.service.jobstore", "tuner.service.membership"} & modules_imported(p)
    }
    assert importing == {}
