"""benchmarks/compile_reuse.py on the CPU: each candidate in a new process on one cache folder;
the same run again in a new process reads every graph back from the disk cache."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.compile_reuse import _changed, _value

ROOT = Path(__file__).resolve().parents[2]


def test_config_values_are_read_as_the_config_takes_them() -> None:
    assert _value("sync_interval=3") == ("sync_interval", 3)
    assert _value("checkpoint_share=0.5") == ("checkpoint_share", 0.5)
    assert _value("pin_memory=true") == ("pin_memory", True)
    assert _value("compile=default") == ("compile", "default")
    assert _changed({"compile": "default", "num_streams": 1}) == {"compile": "default"}


def _run(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [
        sys.executable,
        "benchmarks/compile_reuse.py",
        "--workload=mlp",
        "--preset=tiny",
        "--device=cpu",
        "--precision=fp32",
        "--reference-precision=fp32",
        "--config=compile=default,sync_interval=2",
        "--steps=4",
        "--commit=abc",
        f"--out={tmp_path}",
        *extra,
    ]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)


def test_an_unknown_candidate_is_refused_by_name(tmp_path: Path) -> None:
    done = _run(tmp_path, "--candidates=trial,twin")
    assert done.returncode == 2
    assert "--candidates: twin: allowed trial, trial-again, gate-off" in done.stderr


@pytest.mark.slow
def test_the_same_run_in_a_new_process_reads_the_first_ones_graphs(tmp_path: Path) -> None:
    done = _run(tmp_path, "--candidates=trial,trial-again,gate-off-after-strict")
    assert done.returncode == 0, done.stderr[-3000:]
    [path] = tmp_path.glob("compile-reuse-cpu-*.json")
    data = json.loads(path.read_text())
    assert data["meta"]["commit"] == "abc" and data["meta"]["file"] == path.name
    first, again = data["candidates"]["trial"], data["candidates"]["trial-again"]
    assert (
        first["counters"]["fxgraph_cache_miss"] > 0 and first["counters"]["fxgraph_cache_hit"] == 0
    )
    assert again["counters"]["fxgraph_cache_hit"] == first["counters"]["fxgraph_cache_miss"]
    assert again["counters"]["fxgraph_cache_miss"] == 0
    assert data["candidates"]["gate-off-after-strict"]["seconds"] > 0
    assert "| trial-again |" in path.with_suffix(".md").read_text()


@pytest.mark.slow
def test_a_bypassed_autograd_cache_is_recorded_with_its_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """AOTAutograd keeps no counter of why it bypassed its cache (at 384c19e the float8 step's
    bypass came back with none): the reason it logs is recorded, and only while asked."""
    import torch

    from benchmarks.compile_reuse import CACHE_LOGGERS, BypassReasons, _bypasses

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))

    @torch._dynamo.allow_in_graph
    def doubled(x: torch.Tensor) -> torch.Tensor:
        return x * 2  # a function of its own in the graph: not known to AOTAutograd as safe

    def step(x: torch.Tensor) -> torch.Tensor:
        return doubled(x).sin()

    with BypassReasons() as reasons:
        torch.compile(step)(torch.randn(4, requires_grad=True)).sum().backward()
    [(reason, count)] = reasons.seen.items()
    assert reason.startswith("autograd_cache:Unsupported call_function target") and count == 1
    assert "doubled" in reason and _bypasses(reasons.seen)[reason] == 1
    for name in CACHE_LOGGERS:  # no longer installed
        assert reasons not in logging.getLogger(name).handlers
