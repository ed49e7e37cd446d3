"""A cancel asked at the edges of a job's final round ends the job as cancelled, whenever the
heartbeat would have read it: a real worker in this process, real tiny jobs, real SQLite. The
cancel is asked from inside the job's own run (its trials just ended; its final round deciding),
with the heartbeat 60 s apart, so only the worker's own reads can see it in time. A probe of
the service (2026-12-07) saw such jobs end succeeded or cancelled by timing alone."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import make_app, make_worker
from tests.api.helpers import AUTH, TINY_JOB
from tuner.search.search import Search
from tuner.service.jobstore import JobStore


def _run_cancelling(storage: str, monkeypatch: pytest.MonkeyPatch, at: str) -> dict[str, Any]:
    """One tiny job run to its end by a worker, cancelled through the store when the search's
    method `at` is called; the job as the API then shows it, and whether `decide` ran."""
    store, asked, decided = JobStore(storage), [], []
    original = getattr(Search, at)
    original_decide = Search.decide

    def cancelling(self: Search, *args: Any, **kwargs: Any) -> Any:
        if at == "decide":
            store.cancel(asked[0])
            return original(self, *args, **kwargs)
        result = original(self, *args, **kwargs)
        store.cancel(asked[0])  # the trials are over; the final round not claimed yet
        return result

    def deciding(self: Search) -> Any:
        decided.append(True)
        return original_decide(self)

    monkeypatch.setattr(Search, at, cancelling)
    if at != "decide":
        monkeypatch.setattr(Search, "decide", deciding)
    with TestClient(make_app(storage)) as client:
        job = client.post("/v1/jobs", json=TINY_JOB | {"trials": 2}, headers=AUTH).json()
        asked.append(job["id"])
        make_worker(storage, heartbeat_s=60.0).run_once()
        ended = client.get(f"/v1/jobs/{job['id']}", headers=AUTH).json()
        best = client.get(f"/v1/jobs/{job['id']}/best", headers=AUTH)
    return ended | {"decided": bool(decided), "best_status": best.status_code}


def test_a_cancel_asked_before_the_final_round_ends_the_job_without_one(
    storage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ended = _run_cancelling(storage, monkeypatch, "run_trials")
    assert ended["status"] == "cancelled" and ended["cancel_requested"]
    assert not ended["decided"] and not ended["has_recommendation"]
    assert ended["best_status"] == 409
    assert ended["n_complete"] == 2  # the trials it ran stay counted


def test_a_cancel_asked_during_the_final_round_ends_the_job_cancelled_with_its_answer(
    storage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ended = _run_cancelling(storage, monkeypatch, "decide")
    assert ended["status"] == "cancelled" and ended["cancel_requested"]
    assert ended["has_recommendation"] and ended["best_status"] == 200
