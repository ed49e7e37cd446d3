"""The seed design's LibTorch trainer (examples/libtorch/), built with CMake against the torch in
this venv and run through the program protocol on the CPU: its settings, its reports, its
losses against the Python built-in's, and a tuning job of it by one command.

The build is conftest.py's `binary` fixture.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.examples.conftest import REGISTRY, ROOT, load_example
from trainers import LoopConfig, RunArgs
from trainers.gate.envelope import Envelope
from trainers.program import Program, ProgramFailed, run_program

pytestmark = pytest.mark.slow


def with_args(program: Program, *extra: str) -> Program:
    return dataclasses.replace(program, command=(*program.command, *extra))


@pytest.mark.parametrize(
    "config",
    [
        LoopConfig(),
        LoopConfig(num_streams=2, sync_mode="event", sync_interval=4, prefetch_depth=2),
        LoopConfig(num_streams=4, sync_mode="query", sync_interval=3, pin_memory=True),
        LoopConfig(num_streams=3, sync_interval=7, non_blocking=True),
    ],
)
def test_every_setting_runs_and_reports_every_step_and_window(
    program: Program, config: LoopConfig
) -> None:
    result = run_program(
        program, "tiny", config, RunArgs(steps=12, warmup=2, windows=3, device="cpu")
    )
    assert len(result.losses) == 14 and all(0.0 < x < 10.0 for x in result.losses)
    assert [w.steps for w in result.windows] == [4, 4, 4]
    assert all(w.wall_ms > 0 for w in result.windows)
    assert result.samples_per_batch == 8
    # One sync every sync_interval steps, plus the final drain.
    assert result.n_syncs == 14 // config.sync_interval + 1


def test_a_bad_setting_fails_the_run_with_the_programs_own_words(program: Program) -> None:
    with pytest.raises(ProgramFailed, match="STREAMTUNE_CUDA_GRAPH=true: allowed false"):
        run_program(
            program, "tiny", LoopConfig(cuda_graph=True), RunArgs(steps=4, windows=1, device="cpu")
        )
    broken = with_args(program, "--dropout")
    with pytest.raises(ProgramFailed, match=r"exited with status 2.*--dropout: needs a value"):
        run_program(broken, "tiny", LoopConfig(), RunArgs(steps=4, windows=1, device="cpu"))


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--steps", "5x"], "--steps 5x: not a number"),
        (["--steps", "0"], "--steps 0: allowed an integer >= 1"),
        (["--dropout", "1.5"], "allowed a number in [0, 1)"),
        (["--preset", "huge"], "--preset huge: allowed tiny, small, medium, large"),
        (["--layers"], "--layers: unknown option"),
    ],
)
def test_bad_options_on_its_own_name_the_option(binary: Path, args: list[str], says: str) -> None:
    done = subprocess.run([binary, *args], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and says in done.stderr


def test_from_the_python_weights_its_losses_are_the_python_loops_within_the_gate(
    program: Program, tmp_path: Path
) -> None:
    steps = 40
    init = load_example("export_init").export("tiny", 0, tmp_path / "init.pt")
    # From the Python built-in's weights and data, dropout off (the gate's trajectories run
    # without dropout).
    cpp = with_args(program, "--init", str(init), "--dropout", "0")
    envelope = Envelope.measure("transformer", "tiny", RunArgs(steps=steps, seed=0, device="cpu"))
    for config in (LoopConfig(), LoopConfig(num_streams=2, sync_mode="query", sync_interval=5)):
        losses = run_program(
            cpp, "tiny", config, RunArgs(steps=steps, warmup=0, windows=2, device="cpu")
        )
        verdict = envelope.judge(losses.losses)
        assert verdict.passed, verdict.reason
        # The same weights and batches: the first loss is the same forward pass.
        assert losses.losses[0] == pytest.approx(envelope.reference[0], rel=1e-5)
    # From its own weights (no --init) the trajectory is another one: the gate tells them apart.
    own = run_program(
        with_args(program, "--dropout", "0"),
        "tiny",
        LoopConfig(),
        RunArgs(steps=steps, warmup=0, windows=1, device="cpu"),
    )
    assert not envelope.judge(own.losses).passed


def test_one_command_tunes_the_cpp_trainer(binary: Path, tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'cpp.db'}"
    command = [
        sys.executable, "-m", "tuner", "run", "--program", "libtorch-transformer",
        "--preset", "tiny", "--trials", "3", "--storage", storage, "--device", "cpu", "--json",
        "--windows", "2", "--window-steps", "5", "--warmup", "1", "--final-rounds", "1",
        "--top-k", "1", "--parity-steps", "6",
        "--timeout", "600",  # all 3 trials, however loaded the machine (a CPU's default is 30 s)
    ]  # fmt: skip
    env = {"TUNER_PROGRAMS": str(REGISTRY), "PATH": os.environ["PATH"], "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=900, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rec = json.loads(done.stdout)
    assert rec["workload"] == "program:libtorch-transformer"
    assert rec["trial_counts"]["complete"] == 3
    assert rec["parity"]["test"] == "equivalence" and rec["parity"]["passed"]
    config = LoopConfig.from_dict(rec["config"])
    assert config.compile == "none" and config.num_workers == 0  # what the program lacks


def test_a_job_of_the_cpp_trainer_runs_through_the_service(binary: Path, tmp_path: Path) -> None:
    """A real `python -m tuner serve` with the registry: the job names the program, the worker
    runs the binary per trial, and the best config comes back over HTTP."""
    from tests.api.helpers import wait_for
    from tests.api.test_server import Server

    server = Server(tmp_path, programs=str(REGISTRY))
    try:
        server.start()
        job = {"workload": "program:libtorch-transformer", "preset": "tiny", "trials": 2}
        created = server.http.post("/v1/jobs", json=job | {"device": "cpu"})
        assert created.status_code == 201, created.text
        location = created.headers["Location"]
        done = wait_for(
            lambda: (
                (j := server.http.get(location).json())["status"] in ("succeeded", "failed") and j
            ),
            timeout_s=300,
            what="the job to end",
        )
        assert done["status"] == "succeeded", done
        assert done["n_complete"] == 2
        best = server.http.get(f"{location}/best").json()
        assert LoopConfig.from_dict(best["config"]).compile == "none"
    finally:
        if server.proc is not None:
            server.kill()
        server.http.close()


def test_the_default_search_budget_keeps_a_programs_profiles_off(
    program: Program, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a GPU, `python -m tuner run` gives the default space a search budget; that must not
    bring back the profiles a program's job turns off (it did, and the job failed after its
    final round on the H100). The CPU's space gets no budget, so one is forced here."""
    from tuner.search import study as search
    from tuner.search.measuring.measure import Protocol
    from tuner.search.options import RunOptions

    monkeypatch.setattr(search, "search_budget", lambda timeout_s, space_name, workers=1: 600.0)
    monkeypatch.setenv("TUNER_PROGRAMS", str(REGISTRY))
    rec = search.run_study(
        RunOptions(
            workload="program:libtorch-transformer",
            preset="tiny",
            trials=2,
            storage=f"sqlite:///{tmp_path / 'budget.db'}",
            device="cpu",
            profile="baselines",
            final_rounds=1,
            top_k=1,
            parity_steps=4,
            protocol=Protocol(warmup=1, windows=2, window_steps=3),
        )
    )
    assert rec.config is not None and rec.trial_counts.complete == 2
