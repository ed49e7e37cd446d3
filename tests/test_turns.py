"""A test marked `alone` runs with nothing beside it in a parallel run (`tests/turns.py`), and
the other tests still run two at a time: a real pytest-xdist run of timed sleeps."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]
ROOT = Path(__file__).resolve().parents[1]

CONFTEST = """
from tests.turns import pytest_runtest_protocol  # noqa: F401


def pytest_configure(config):
    config.addinivalue_line("markers", "alone: runs with nothing beside it")
"""

# Each test writes when it ran.
TIMED = """
import json, os, time
import pytest


def timed(name, seconds):
    started = time.monotonic()
    time.sleep(seconds)
    with open(os.environ["TURNS_LOG"], "a") as log:
        log.write(json.dumps([name, started, time.monotonic()]) + "\\n")
"""

ALONE = """
@pytest.mark.alone
def test_alone():
    timed("alone", 1.0)
"""


def test_an_alone_test_runs_with_nothing_beside_it(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    pytest.importorskip("xdist")
    log = tmp_path / "turns.jsonl"
    monkeypatch.setenv("TURNS_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    pytester.makeconftest(CONFTEST)
    normal = "\n".join(f"def test_{i}():\n    timed('{{f}}-{i}', 0.3)\n" for i in range(6))
    pytester.makepyfile(
        # The alone test first in its file, so that it starts while the other file runs.
        test_b=TIMED + ALONE + normal.replace("{f}", "b"),
        test_c=TIMED + normal.replace("{f}", "c"),
    )
    result = pytester.runpytest_subprocess(
        "-n", "2", "--dist", "loadfile", "-p", "no:cacheprovider"
    )
    result.assert_outcomes(passed=13)
    spans = {
        name: (start, end) for name, start, end in map(json.loads, log.read_text().splitlines())
    }
    alone = spans.pop("alone")
    assert all(end <= alone[0] or start >= alone[1] for start, end in spans.values()), spans

    def overlap(x: tuple[float, float], y: tuple[float, float]) -> bool:
        return x[0] < y[1] and y[0] < x[1]

    # The others still ran two at a time: some test of b beside some test of c.
    b = [s for n, s in spans.items() if n.startswith("b-")]
    c = [s for n, s in spans.items() if n.startswith("c-")]
    assert any(overlap(x, y) for x in b for y in c), spans
