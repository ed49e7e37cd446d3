"""Why a job waits (issue 56): a queued job for a device that no live worker offers says so and
is `stuck`, and the README's polling loop ends on it as on every terminal status. A real app on
a real SQLite file, a real CPU worker registered in it (started, never running a job)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import make_app, make_worker
from tests.api.helpers import AUTH, TINY_JOB
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
