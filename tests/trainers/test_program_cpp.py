"""The C++ side of the program protocol (examples/libtorch/streamtune_report.hpp), compiled with the
machine's g++ into a small program with a made-up step (no LibTorch), run by `run_program`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from trainers import LoopConfig, RunArgs
from trainers.program import Program, run_program

ROOT = Path(__file__).resolve().parents[2]
HEADER_DIR = ROOT / "examples" / "libtorch"
SOURCE = Path(__file__).parent / "cpp" / "protocol_check.cpp"


@pytest.fixture(scope="module")
def binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ is not installed")
    out = tmp_path_factory.mktemp("cpp") / "protocol_check"
    flags = ["-std=c++17", "-Wall", "-Werror", "-O1", f"-I{HEADER_DIR}"]
    subprocess.run([compiler, *flags, str(SOURCE), "-o", str(out)], check=True, timeout=300)
    return out


def program(binary: Path) -> Program:
    return Program(
        name="cpp-check",
        command=(str(binary),),
        cwd=binary.parent,
        presets=("tiny",),
        settings=("sync_interval",),
        timeout_s=60,
    )


def test_a_cpp_program_reports_through_the_header(binary: Path) -> None:
    result = run_program(
        program(binary), "tiny", LoopConfig(sync_interval=3), RunArgs(steps=10, warmup=2, windows=3)
    )
    assert result.losses == [1.0 / (i + 1) + 0.003 for i in range(12)]  # exact: 17 digits
    assert [w.steps for w in result.windows] == [4, 3, 3]
    assert all(w.step_ms >= 2.0 for w in result.windows)  # each step sleeps 2 ms
    assert result.n_syncs == 4 and result.samples_per_batch == 8


def test_a_pruned_cpp_program_is_stopped_between_windows(binary: Path) -> None:
    result = run_program(
        program(binary),
        "tiny",
        LoopConfig(),
        RunArgs(steps=3000, warmup=0, windows=3),
        on_window=lambda index, window: False,
    )
    # Stopped after its first window of 1000 steps (2 s), long before the other 4 s.
    assert result.stopped_early and len(result.windows) == 1
