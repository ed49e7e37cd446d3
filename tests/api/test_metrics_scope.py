"""/metrics by who asks, over real HTTP: an owner's token counts that owner's jobs and trials
only, an admin token every job's, no token nothing; and the operator's opt-in scrape port
(`TUNER_METRICS_PORT`) every job's without a token, served by a real `python -m tuner serve`."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa

from tests.api.conftest import make_app
from tests.api.helpers import (
    ADMIN_AUTH,
    AUTH,
    OTHER_AUTH,
    TINY_JOB,
    TOKEN,
    clean_env,
    env_of,
    free_port,
    served,
    sqlite_url,
    wait_for,
)
from tuner.service.jobstore import JobStore
from tuner.service.tables import TrialEventRow, utcnow


def _value(text: str, series: str) -> float:
    found = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    assert found, (series, text)
    return float(found.group(1))


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[str, str]]:
    storage = sqlite_url(tmp_path)
    app = make_app(storage, access_log=False)
    with served(app) as port:
        yield f"http://127.0.0.1:{port}", storage


def _finished_trials(storage: str, job_id: str, states: list[str]) -> None:
    """Trial events of a job, as a worker records them (the rows /metrics counts)."""
    engine = JobStore(storage).engine
    with engine.begin() as conn:
        for number, state in enumerate(states):
            conn.execute(
                sa.insert(TrialEventRow).values(
                    job_id=job_id, number=number, state=state, seconds=0.2, finished_at=utcnow()
                )
            )


def test_each_token_sees_its_own_counts_and_an_admin_all(live: tuple[str, str]) -> None:
    base, storage = live
    with httpx.Client(base_url=base, timeout=30) as http:
        mine = [http.post("/v1/jobs", json=TINY_JOB, headers=AUTH).json() for _ in range(2)]
        theirs = [http.post("/v1/jobs", json=TINY_JOB, headers=OTHER_AUTH).json() for _ in range(3)]
        _finished_trials(storage, mine[0]["id"], ["complete"])
        _finished_trials(storage, theirs[0]["id"], ["complete", "complete", "failed", "pruned"])
        expected = {
            "mine": (AUTH, 2, 1, 0, 1),
            "theirs": (OTHER_AUTH, 3, 2, 1, 4),
            "admin": (ADMIN_AUTH, 5, 3, 1, 5),
        }
        for who, (auth, queued, complete, failed, count) in expected.items():
            for path in ("/metrics", "/v1/metrics"):
                answer = http.get(path, headers=auth)
                assert answer.status_code == 200, (who, answer.text)
                text = answer.text
                assert _value(text, 'streamtune_jobs{state="queued"}') == queued, who
                assert _value(text, 'streamtune_trials_total{state="complete"}') == complete, who
                assert _value(text, 'streamtune_trials_total{state="failed"}') == failed, who
                assert _value(text, "streamtune_trial_duration_seconds_count") == count, who
        assert "of all jobs" in http.get("/metrics", headers=ADMIN_AUTH).text
        assert "of all jobs" not in http.get("/metrics", headers=AUTH).text
        assert http.get("/metrics").status_code == 401


def test_the_opt_in_scrape_port_serves_every_jobs_counts_without_a_token(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    port, scrape = free_port(), free_port()
    settings = {"storage": storage, "api_tokens": TOKEN, "metrics_port": scrape}
    env = clean_env() | env_of(settings)
    with (tmp_path / "server.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tuner", "serve", "--port", str(port), "--no-worker"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=os.getcwd(),
        )
    try:
        with (
            httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as api,
            httpx.Client(base_url=f"http://127.0.0.1:{scrape}", timeout=10) as metrics,
        ):

            def up() -> bool:
                assert proc.poll() is None, (tmp_path / "server.log").read_text()
                try:
                    return metrics.get("/metrics").status_code == 200
                except httpx.TransportError:
                    return False

            wait_for(up, timeout_s=120, what="the scrape port")
            assert api.post("/v1/jobs", json=TINY_JOB, headers=AUTH).status_code == 201
            text = metrics.get("/metrics").text
            assert _value(text, 'streamtune_jobs{state="queued"}') == 1
            assert "of all jobs" in text
            assert metrics.get("/v1/jobs").status_code == 404  # the scrape port serves nothing else
            assert api.get("/metrics").status_code == 401  # the API's port still wants a token
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
