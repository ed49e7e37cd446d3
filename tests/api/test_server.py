"""A real `python -m tuner serve` (uvicorn + a worker process) on 127.0.0.1, over real HTTP.

Slow: each server start imports torch twice (the API and its worker).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import optuna
import pytest
from optuna.trial import TrialState

from tests.api.helpers import (
    AUTH,
    SMALL,
    TINY_JOB,
    TOKEN,
    clean_env,
    env_of,
    free_port,
    sqlite_url,
    wait_for,
)
from tuner.service.jobstore import JobStore
from tuner.service.slots import ORPHAN_REASON
from tuner.store.counting import count_trials as trial_counts

pytestmark = pytest.mark.slow


class Server:
    """`python -m tuner serve --workers 1` in its own process group (killed as one)."""

    def __init__(self, tmp_path: Path, **settings: Any) -> None:
        self.port = free_port()
        self.storage = sqlite_url(tmp_path)
        self.log = tmp_path / "server.log"
        values = SMALL | {
            "storage": self.storage,
            "api_tokens": TOKEN,
            "lease_s": 3,
            "heartbeat_s": 0.3,
            "torch_threads": 1,
            "access_log": False,
        }
        self.env = clean_env() | env_of(values | settings)
        self.proc: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", headers=AUTH, timeout=10)

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tuner",
                    "serve",
                    "--port",
                    str(self.port),
                    "--workers",
                    "1",
                ],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=os.getcwd(),
            )

        def ready() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()
            try:
                return self.http.get("/healthz").json()["workers_alive"] >= 1
            except httpx.TransportError:
                return False

        wait_for(ready, timeout_s=90, what="the server and its worker", every_s=0.2)

    def kill(self, sig: signal.Signals = signal.SIGKILL) -> int:
        assert self.proc is not None
        if sig == signal.SIGKILL:
            os.killpg(self.proc.pid, sig)  # the server and its worker, at once
        else:
            self.proc.send_signal(sig)
        code = self.proc.wait(timeout=60)
        self.proc = None
        return code

    def job(self, job_id: str) -> dict[str, Any]:
        got: dict[str, Any] = self.http.get(f"/v1/jobs/{job_id}").json()
        return got


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    running = Server(tmp_path)
    yield running
    if running.proc is not None and running.proc.poll() is None:
        os.killpg(running.proc.pid, signal.SIGKILL)
        running.proc.wait()
    running.http.close()


def test_post_a_job_poll_until_it_succeeds_and_read_its_best(server: Server) -> None:
    server.start()
    created = server.http.post("/v1/jobs", json=TINY_JOB)
    assert created.status_code == 201
    location = created.headers["Location"]
    done = wait_for(
        lambda: (j := server.http.get(location).json())["status"] in ("succeeded", "failed") and j,
        timeout_s=90,
        what="the job to end",
    )
    assert done["status"] == "succeeded", done
    assert done["n_complete"] + done["n_failed"] + done["n_pruned"] == 3
    assert done["search_ended"] == "every trial asked for was run or taken (3 run)"
    best = server.http.get(f"{location}/best")
    assert best.status_code == 200 and best.json()["study"] == done["study"]
    assert server.http.get("/v1/jobs", headers={"Authorization": "Bearer nope"}).status_code == (
        401
    )
    # SIGTERM: uvicorn stops, and so does the worker (it is told to, and waited for).
    assert server.kill(signal.SIGTERM) == 0
    with pytest.raises(httpx.TransportError):
        server.http.get("/healthz")


def test_a_killed_server_resumes_its_job_without_losing_or_repeating_trials(server: Server) -> None:
    server.env |= env_of({"measure_windows": 5, "measure_window_steps": 20})
    server.start()
    asked = 8
    job_id = server.http.post(
        "/v1/jobs", json=TINY_JOB | {"workload": "transformer", "trials": asked}
    ).json()["id"]
    wait_for(
        lambda: server.job(job_id)["n_complete"] >= 2, timeout_s=90, what="two complete trials"
    )
    server.kill()  # SIGKILL to the server and its worker: nothing gets to clean up
    study = f"job-{job_id}"
    before = optuna.load_study(study_name=study, storage=server.storage).get_trials()
    kept = {t.number: t.values for t in before if t.state == TrialState.COMPLETE}
    left_running = [t.number for t in before if t.state == TrialState.RUNNING]
    assert len(kept) >= 2 and JobStore(server.storage).get(job_id).status == "running"

    server.start()
    done = wait_for(
        lambda: (j := server.job(job_id))["status"] in ("succeeded", "failed") and j,
        timeout_s=120,
        what="the resumed job to end",
    )
    assert done["status"] == "succeeded", done
    assert done["attempts"] == 2
    after = optuna.load_study(study_name=study, storage=server.storage).get_trials()
    counts = trial_counts(after)
    assert counts.counted == asked
    assert done["n_complete"] + done["n_failed"] + done["n_pruned"] == asked
    assert {t.number: t.values for t in after if t.number in kept} == kept  # none lost
    assert len({t.number for t in after}) == len(after)
    for number in left_running:  # failed as interrupted, and run again (not counted)
        assert after[number].state == TrialState.FAIL
        assert after[number].user_attrs["failure_reason"] == ORPHAN_REASON
    assert server.http.get(f"/v1/jobs/{job_id}/best").status_code == 200
    trials = server.http.get(f"/v1/jobs/{job_id}/trials", params={"limit": 200}).json()
    assert sum(t["counted"] for t in trials["items"]) == asked
