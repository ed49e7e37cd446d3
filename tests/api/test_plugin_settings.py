"""An operator's mistake in `TUNER_WORKLOADS` stops `python -m api` (what `tuner serve` runs)
with one line naming the variable, the entry and the cause, before it listens (a new user's
trial, 2026-12-02: a module that does not exist printed 30 lines of traceback, JSON that does
not parse a pydantic-settings error naming neither, and a plug-in named `transformer` was taken
without a word while the built-in ran instead)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("workloads", "said"),
    [
        (
            '{"ghost": "mymodels_nowhere.nothere:build"}',
            "TUNER_WORKLOADS: ghost='mymodels_nowhere.nothere:build': workload=",
        ),
        ('{"kw": "tests.trainers.own_workloads:sized",}', "TUNER_WORKLOADS: not valid JSON ("),
        (
            '{"transformer": "tests.trainers.own_workloads:sized"}',
            "TUNER_WORKLOADS: 'transformer' is a built-in workload's name",
        ),
        (
            '{"mine": "tests.trainers.own_workloads:declares_a_name"}',
            "presets must be a tuple or list of names",
        ),
        (
            '{"my model": "tests.trainers.own_workloads:sized"}',
            "TUNER_WORKLOADS: 'my model' is not a name a job can ask for: allowed 1 to 128",
        ),
    ],
    ids=[
        "no-module",
        "bad-json",
        "a-built-ins-name",
        "malformed-presets",
        "a-name-jobs-cannot-ask",
    ],
)
def test_a_bad_plug_in_stops_the_server_in_one_line(
    tmp_path: Path, workloads: str, said: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNER_")}
    env |= {
        "TUNER_WORKLOADS": workloads,
        "TUNER_STORAGE": f"sqlite:///{tmp_path / 'tuner.db'}",
        "PYTHONPATH": str(ROOT),
    }
    done = subprocess.run(
        [sys.executable, "-m", "api", "--port", "8799", "--no-worker"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: TUNER_WORKLOADS") and said in last, done.stderr[-3000:]
