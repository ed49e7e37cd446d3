"""Why a job waits (issue 56): a queued job for a device that no live worker offers says so and
is `stuck`, and the README's polling loop ends on it as on every terminal status. A real app on
a real SQLite file, a real CPU worker registered in it (started, never running a job)."""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient

from tests.api.conftest import make_app, make_worker
from tests.api.helpers import AUTH, TINY_JOB
from tuner.service.tables import JobRow, WorkerRow
from tuner.service.worker import Worker

README = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")


@pytest.fixture
def cpu_worker(storage: str) -> Iterator[Worker]:
    worker = make_worker(storage)
    worker.start()  # registered and heartbeating, as `serve`'s worker is while idle
    yield worker
    worker.close()


def submit(client: TestClient, device: str) -> str:
    created = client.post("/v1/jobs", json=TINY_JOB | {"device": device}, headers=AUTH)
    assert created.status_code == 201, created.text
    job_id: str = created.json()["id"]
    return job_id


def readme_loop_ends(body: str) -> bool:
    """The README's polling loop's `grep -Eq` pattern, on the job's JSON as the API sends it."""
    (pattern,) = re.findall(r"grep -Eq '([^']+)'; do sleep 2; done", README)
    return re.search(pattern, body) is not None


def test_a_job_for_a_device_no_live_worker_offers_is_stuck_and_says_why(
    storage: str, cpu_worker: Worker
) -> None:
    with TestClient(make_app(storage)) as client:
        for device in ("cuda", "cuda:99"):
            got = client.get(f"/v1/jobs/{submit(client, device)}", headers=AUTH)
            job = got.json()
            assert (job["status"], job["stuck"]) == ("queued", True)
            assert job["waiting"] == (
                f"no live worker offers device {device!r} (they offer auto, cpu): start a "
                "worker on it, or cancel the job"
            )
            assert readme_loop_ends(got.text)
        runnable = client.get(f"/v1/jobs/{submit(client, 'cpu')}", headers=AUTH)
        assert (runnable.json()["stuck"], runnable.json()["waiting"]) == (
            False,
            "for a free worker offering 'cpu'",
        )
        assert not readme_loop_ends(runnable.text)
        listed = client.get("/v1/jobs", headers=AUTH).json()["items"]
        assert sorted(j["device"] for j in listed if j["stuck"]) == ["cuda", "cuda:99"]


def test_without_any_live_worker_a_job_waits_but_is_not_stuck(storage: str) -> None:
    """`serve` answers before its worker has registered: a loop must not end then."""
    with TestClient(make_app(storage)) as client:
        job = client.get(f"/v1/jobs/{submit(client, 'cuda')}", headers=AUTH).json()
    assert (job["stuck"], job["waiting"]) == (
        False,
        "no live worker: none is running now (GET /healthz counts them)",
    )


@pytest.mark.parametrize("status", ["succeeded", "failed", "cancelled"])
def test_the_readme_loop_ends_on_every_terminal_status(status: str) -> None:
    assert readme_loop_ends(json.dumps({"status": status}, separators=(",", ":")))
    assert not readme_loop_ends(json.dumps({"status": "running"}, separators=(",", ":")))


def test_a_running_job_whose_worker_died_says_so_and_a_cancel_ends_it_now(storage: str) -> None:
    """A worker killed outright (SIGKILL) stops heartbeating its job and its own row: the job
    had stayed "running" with no word, and a cancel only flagged it, until another worker
    started (a probe of the service, 2026-12-07). Here a real worker claims the job, then its
    heartbeats are set back past two leases, as the time after such a kill leaves them. Not
    `stuck`: a worker that starts takes it over, as a restarted `serve`'s does."""
    worker = make_worker(storage)
    worker.start()
    with TestClient(make_app(storage, lease_s=30.0)) as client:
        job_id = submit(client, "cpu")
        assert worker.store.claim(worker.id, devices=["cpu"]) is not None
        fresh = client.get(f"/v1/jobs/{job_id}", headers=AUTH).json()
        assert (fresh["status"], fresh["waiting"], fresh["stuck"]) == ("running", None, False)
        worker.close()
        _set_back(worker, seconds=45)  # past one lease, not two: the workers' rule, not ours
        assert client.get(f"/v1/jobs/{job_id}", headers=AUTH).json()["waiting"] is None
        _set_back(worker, seconds=90)
        job = client.get(f"/v1/jobs/{job_id}", headers=AUTH).json()
        assert (job["status"], job["stuck"]) == ("running", False)
        assert job["waiting"].startswith("no worker has heartbeated it since ")
        assert "no worker is alive: a worker that starts takes it over" in job["waiting"]
        cancelled = client.post(f"/v1/jobs/{job_id}/cancel", headers=AUTH)
        assert cancelled.status_code == 200
        ended = cancelled.json()
        assert (ended["status"], ended["cancel_requested"]) == ("cancelled", True)
        assert ended["finished_at"] and ended["phase"] is None and ended["waiting"] is None
    with worker.store.engine.connect() as conn:  # its member's row let go of it
        assert conn.scalar(sa.select(sa.func.count()).where(WorkerRow.job_id == job_id)) == 0


def test_a_cancel_only_flags_an_old_job_a_live_member_or_a_finalizer_still_holds(
    storage: str, cpu_worker: Worker
) -> None:
    """The job's own heartbeat is old (a database outage stops every heartbeat), but a member's
    row is alive, or a finalizer runs its final round: the worker ends it, not the API."""
    with TestClient(make_app(storage, lease_s=30.0)) as client:
        held = submit(client, "cpu")
        assert cpu_worker.store.claim(cpu_worker.id, devices=["cpu"]) is not None
        old = dt.datetime.now(dt.UTC).replace(tzinfo=None) - dt.timedelta(seconds=90)
        with cpu_worker.store.engine.begin() as conn:
            conn.execute(sa.update(JobRow).values(heartbeat_at=old))
        flagged = client.post(f"/v1/jobs/{held}/cancel", headers=AUTH).json()
        assert (flagged["status"], flagged["cancel_requested"]) == ("running", True)
        finalizing = submit(client, "cpu")
        with cpu_worker.store.engine.begin() as conn:
            conn.execute(
                sa.update(JobRow)
                .where(JobRow.id == finalizing)
                .values(status="running", heartbeat_at=old, finalizer="gone", worker="gone")
            )
        flagged = client.post(f"/v1/jobs/{finalizing}/cancel", headers=AUTH).json()
        assert (flagged["status"], flagged["cancel_requested"]) == ("running", True)


def _set_back(worker: Worker, *, seconds: float) -> None:
    """Every job's and worker's heartbeat `seconds` ago, as a kill that long ago leaves them."""
    old = dt.datetime.now(dt.UTC).replace(tzinfo=None) - dt.timedelta(seconds=seconds)
    with worker.store.engine.begin() as conn:
        conn.execute(sa.update(JobRow).values(heartbeat_at=old))
        conn.execute(sa.update(WorkerRow).values(heartbeat_at=old))
