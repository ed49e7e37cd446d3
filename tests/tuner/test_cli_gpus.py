"""`python -m tuner run --gpus N`: one job's trials on N devices through the service's workers.

This machine has no GPU: CPU worker processes stand in for GPUs (`TUNER_CPU_STANDINS`, read only
with `--device cpu`). Everything else is the production path: the real CLI in a subprocess, real
`python -m tuner worker --job` children, real Optuna on a real SQLite file, the tiny workload.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from tests.tuner.test_cli_run import REPO, run_main, tuner
from tests.tuner.tiny import RUN_FLAGS, WORKLOADS, sqlite_url
from tuner.search.trials import trials_without_gain
from tuner.service.jobstore import JobStore
from tuner.store import keys
from tuner.store.counting import count_trials
from tuner.store.keys import INTERRUPTED_PREFIX, OWNER

STANDINS = "TUNER_CPU_STANDINS"


def standin_env(count: int | None, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNER_")}
    env["TUNER_GATE_MEMO"] = os.environ.get("TUNER_GATE_MEMO", "off")
    if count is not None:
        env[STANDINS] = str(count)
    return env | more


def test_two_standins_share_the_trials_and_one_runs_the_final_round(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    # Workers poll for a job to join every 0.3 s (TUNER_POLL_S; 2 s by default). The workload's
    # steps take PACE_S each, so 8 trials take the claimer well over 10 s whatever the machine's
    # load: CI once saw the mlp's 8 trials done in 3.3 s, before the second worker had imported
    # torch, and one worker ran them all.
    env = standin_env(2, TUNER_POLL_S="0.3", TUNER_TORCH_THREADS="1")
    flags = (*RUN_FLAGS, "--workload", f"{WORKLOADS}:paced", "--trials", "8")
    out = tuner("run", *flags, "--storage", storage, "--gpus", "2", "--json", env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    rec = json.loads(out.stdout)
    node = rec["node"]
    study = optuna.load_study(study_name=rec["study"], storage=storage)
    trials = study.get_trials(deepcopy=False)
    owners = {t.user_attrs[OWNER] for t in trials}
    assert len(owners) >= 2, (owners, out.stderr[-3000:])  # spread over the workers
    assert len(trials) == 8 and {t.state.name for t in trials} <= {"COMPLETE", "PRUNED"}
    # One final round, run by one of the job's workers: every finalist measured on one device.
    finals = [k for k in study.user_attrs if k.startswith(keys.FINAL_PREFIX)]
    assert len(finals) == 1
    assert study.user_attrs[keys.FINALIZER] in owners
    # The run's own settings reach the workers: on a CPU it profiles nothing (its default).
    assert not [k for k in study.user_attrs if k.startswith(keys.PROFILE_PREFIX)]
    assert node["final_round_on"] in {"cpu stand-in 0", "cpu stand-in 1"}
    assert set(node["trials_by_device"]) == {"cpu stand-in 0", "cpu stand-in 1"}
    assert sum(node["trials_by_device"].values()) == 8
    # Wall time and GPU-seconds: two workers held their device for most of the wall time.
    assert node["gpus"] == 2 and node["standins"] is True
    assert 0 < node["trial_seconds"] <= node["gpu_seconds"] <= 2 * node["wall_s"] + 1
    # Each trial's progress line names its device, and the job ended as a job does.
    lines = re.findall(r"trial (\d+) on (cpu stand-in \d) (complete|pruned)", out.stderr)
    assert sorted(int(n) for n, _, _ in lines) == list(range(8))
    assert {where for _, where, _ in lines} == {"cpu stand-in 0", "cpu stand-in 1"}
    assert "GPU-seconds used" in out.stderr
    (job,), _ = JobStore(storage).list()
    assert (job.status, job.study, job.spec["gpus"]) == ("succeeded", rec["study"], 2)
    assert job.dedicated  # no service worker on a shared database takes it or joins it


def test_the_patience_ends_the_trials_of_a_job_on_several_gpus(tmp_path: Path) -> None:
    """`--patience` reaches the workers (the job's `patience`), counts every worker's trials, and
    once it holds with no trial running the job decides: no worker joins again to run more."""
    storage = sqlite_url(tmp_path)
    env = standin_env(2, TUNER_POLL_S="0.3", TUNER_TORCH_THREADS="1")
    asked = 30
    flags = (*RUN_FLAGS, "--workload", f"{WORKLOADS}:paced", "--trials", str(asked))
    out = tuner(
        "run", *flags, "--patience", "1", "--storage", storage, "--gpus", "2", "--json", env=env
    )
    assert out.returncode == 0, out.stderr[-4000:]
    rec = json.loads(out.stdout)
    study = optuna.load_study(study_name=rec["study"], storage=storage)
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    values = [t.values[0] for t in trials if t.state.name == "COMPLETE"]
    assert len(trials) < asked and trials_without_gain(values, 0.01) >= 1, values
    # One session per worker: none left the job and joined it again to start its count afresh.
    sessions = [k for k in study.user_attrs if k.startswith(keys.TIME_PREFIX)]
    assert 1 <= len(sessions) <= 2, sessions
    assert study.user_attrs[keys.JOB_BEGUN] == []
    (job,), _ = JobStore(storage).list()
    assert (job.status, job.spec["patience"]) == ("succeeded", 1)


def test_the_last_trial_of_a_killed_worker_is_run_again_by_the_other(tmp_path: Path) -> None:
    """The worker running the job's last trial is killed (SIGKILL: no chance to fail it) while
    the other, its trials over, helps with the gate: the dead worker's trial is failed as
    interrupted, and the other goes back to the trials and runs it again, so the job counts
    every trial asked for. It had helped on until the job's deadline, then decided on one trial
    fewer (a probe, 2026-12-08): `--timeout` here ends the job that way, within the test."""
    storage, asked = sqlite_url(tmp_path), 4
    # A short lease: the killed worker is taken for dead 3 s after its last heartbeat.
    env = standin_env(2, TUNER_POLL_S="0.3", TUNER_TORCH_THREADS="1")
    env |= {"TUNER_LEASE_S": "3", "TUNER_HEARTBEAT_S": "0.5"}
    flags = (*RUN_FLAGS, "--workload", f"{WORKLOADS}:paced", "--trials", str(asked))
    command = [sys.executable, "-m", "tuner", "run", *flags, "--timeout", "45", "--gpus", "2"]
    log, out = tmp_path / "run.log", tmp_path / "run.json"
    with log.open("w") as err, out.open("w") as sink:
        proc = subprocess.Popen(
            [*command, "--storage", storage, "--json"],
            cwd=REPO,
            env=env,
            stdout=sink,
            stderr=err,
            start_new_session=True,  # the run and its workers: one group to end at the end
        )
        try:
            killed = _kill_the_last_trials_worker(proc, storage, asked)
            proc.wait(timeout=150)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=60)
    text = log.read_text()
    assert proc.returncode == 0, text[-4000:]
    rec = json.loads(out.read_text())
    study = optuna.load_study(study_name=rec["study"], storage=storage)
    trials = study.get_trials(deepcopy=False)
    lost = trials[killed]
    assert lost.state.name == "FAIL", lost.state
    assert lost.user_attrs[keys.FAILURE_REASON].startswith(INTERRUPTED_PREFIX), lost.user_attrs
    # Run again, by the worker that lived, after the lost one: the job counts every trial.
    again = [t for t in trials if t.number > killed and t.state.name in {"COMPLETE", "PRUNED"}]
    assert again and lost.user_attrs[OWNER] not in {t.user_attrs[OWNER] for t in again}
    counts = count_trials(trials)
    assert (counts.counted, counts.interrupted, counts.running) == (asked, 1, 0), text[-3000:]
    ended = rec["search"]["ended"]
    assert ended["by"] == "trials" and f"({asked} run)" in ended["why"], ended
    (job,), _ = JobStore(storage).list()
    assert job.status == "succeeded" and job.n_complete + job.n_pruned == asked


def _kill_the_last_trials_worker(proc: subprocess.Popen[bytes], storage: str, asked: int) -> int:
    """SIGKILL the worker running the job's last trial, once every other trial is counted; the
    trial's number."""
    started = time.monotonic()
    while proc.poll() is None and time.monotonic() - started < 120:
        time.sleep(0.1)
        names = [n for n in optuna.get_all_study_names(storage) if n.startswith("job-")]
        if not names:
            continue
        trials = optuna.load_study(study_name=names[0], storage=storage).get_trials(deepcopy=False)
        counts = count_trials(trials)
        running = [t for t in trials if t.state.name == "RUNNING" and OWNER in t.user_attrs]
        if counts.counted == asked - 1 and len(running) == 1:
            pid = int(running[0].user_attrs[OWNER].rsplit("-", 2)[1])
            assert os.getpgid(pid) == proc.pid  # one of this run's workers, nothing else
            os.kill(pid, signal.SIGKILL)
            return running[0].number
    raise AssertionError(f"the last trial was never seen running (run exit {proc.poll()})")


@pytest.mark.parametrize(
    ("standins", "flags", "message"),
    [
        (2, ("--gpus", "3"), "--gpus: 3 asked, but the device is the CPU, with 2 stand-ins"),
        (None, ("--gpus", "2"), "--gpus: 2 asked, but the device is the CPU, with 0 stand-ins"),
        (None, ("--gpus", "all"), "--gpus: all asked, but the device is the CPU, with 0 stand-ins"),
        (2, ("--gpus", "0"), "--gpus: '0' is invalid: allowed 'all' or a whole number from 1"),
        (2, ("--gpus", "two"), "--gpus: 'two' is invalid: allowed 'all'"),
        (2, ("--gpus", "2", "--seed", "3"), "--seed: not with --gpus 2"),
        (2, ("--gpus", "2", "--device", "cuda:1"), "--device: cuda:1 names one GPU"),
    ],
)
def test_a_bad_gpus_is_one_line_naming_the_flag_and_stores_nothing(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    standins: int | None,
    flags: tuple[str, ...],
    message: str,
) -> None:
    if standins is None:
        monkeypatch.delenv(STANDINS, raising=False)
    else:
        monkeypatch.setenv(STANDINS, str(standins))
    storage = sqlite_url(tmp_path)
    code, out, err = run_main(capsys, "run", *RUN_FLAGS, "--storage", storage, *flags)
    assert code == 2
    assert err.startswith(f"error: {message}") and err.count("\n") == 1, err
    assert out == ""
    db = tmp_path / "t.db"
    assert not db.exists() or not _tables(db) & {"jobs", "trials"}


def _tables(db: Path) -> set[str]:
    with sqlite3.connect(db) as conn:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


def test_fewer_gpus_than_asked_in_a_real_process_exits_2_with_one_line(tmp_path: Path) -> None:
    out = tuner(
        "run", *RUN_FLAGS, "--storage", sqlite_url(tmp_path), "--gpus", "4", env=standin_env(2)
    )
    assert out.returncode == 2
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        "error: --gpus: 4 asked, but the device is the CPU, with 2 stand-ins for GPUs "
        "(TUNER_CPU_STANDINS=2; it lets that many CPU worker processes stand in for GPUs)"
    ], out.stderr
    assert "Traceback" not in out.stderr


def test_a_run_whose_workers_all_exit_cancels_its_job(tmp_path: Path) -> None:
    """Its workers could not start (a bad TUNER_HEARTBEAT_S): the run said so and exited 2, and
    its job stayed queued for a later worker of the storage to run (an operator's probe)."""
    storage = sqlite_url(tmp_path)
    env = standin_env(2, TUNER_HEARTBEAT_S="abc")
    out = tuner("run", *RUN_FLAGS, "--storage", storage, "--gpus", "2", "--trials", "2", env=env)
    assert out.returncode == 2, out.stderr
    assert "error: --gpus: every worker exited before the job ended" in out.stderr
    (jobs, total) = JobStore(storage).list()
    assert total == 1 and jobs[0].status == "cancelled", jobs[0].status


def test_gpus_1_runs_in_this_process_without_a_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(STANDINS, "2")  # stand-ins exist, and --gpus 1 still takes none
    storage = sqlite_url(tmp_path)
    flags = ("run", *RUN_FLAGS, "--storage", storage, "--trials", "2", "--study", "one")
    code, out, err = run_main(capsys, *flags, "--gpus", "1", "--json")
    assert code == 0, err
    rec = json.loads(out)
    assert "node" not in rec and rec["study"] == "one"
    trials = optuna.load_study(study_name="one", storage=storage).get_trials()
    assert len(trials) == 2
    assert JobStore(storage).list() == ([], 0)


def test_the_stand_ins_variable_is_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(STANDINS, "many")
    code, _, err = run_main(
        capsys, "run", *RUN_FLAGS, "--storage", sqlite_url(tmp_path), "--gpus", "2"
    )
    assert code == 2 and "TUNER_CPU_STANDINS='many' is invalid" in err


def test_a_worker_with_no_trial_left_gates_while_the_others_run(tmp_path: Path) -> None:
    """Screening defers every gate to the final round; with `--gpus N` the workers whose trials
    have ended take the gate's parts meanwhile (`tuner.service.gatehelp`), each part once."""
    env = standin_env(3, TUNER_POLL_S="0.3", TUNER_TORCH_THREADS="1")
    flags = (*RUN_FLAGS, "--workload", f"{WORKLOADS}:paced", "--trials", "7", "--screen", "on")
    study = _assert_helpers_gated(tmp_path, (*flags, "--profile", "baselines"), "3", env)
    # Once no trial ran, a helper profiled ahead of the decision (`tuner.search.helping`): a
    # session that profiled and ran no final round, and the recommendation's profiles were
    # copied from what the helpers took (no seconds of their own on the study).
    sessions = [v["phases"] for k, v in study.user_attrs.items() if k.startswith(keys.TIME_PREFIX)]
    assert [p for p in sessions if p["final_round"] == 0 and p["profile"] > 0], sessions
    profiles = {k: v for k, v in study.user_attrs.items() if k.startswith(keys.PROFILE_PREFIX)}
    assert profiles and all("error" not in v for v in profiles.values()), profiles
    assert any(v.get("seconds") == 0.0 for v in profiles.values()), profiles


@pytest.mark.gpu
def test_on_real_gpus_a_worker_with_no_trial_left_gates_while_the_others_run(
    tmp_path: Path,
) -> None:
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs or more")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNER_")}
    flags = (
        *("--workload", "transformer", "--preset", "tiny", "--device", "cuda", "--trials", "8"),
        *("--screen", "on", "--warmup", "2", "--windows", "2", "--window-steps", "5"),
    )
    # With the gate's memo on, as a user's job runs: the helpers' profiles are kept there, and
    # each worker sees its own GPU through CUDA_VISIBLE_DEVICES, which the memo's key leaves out
    # (on 4 H100s at d1073e1 each worker had a memo of its own, and the finalizer profiled again).
    study = _assert_helpers_gated(tmp_path, (*flags, "--profile", "baselines"), "all", env)
    profiles = {k: v for k, v in study.user_attrs.items() if k.startswith(keys.PROFILE_PREFIX)}
    assert profiles and all("error" not in v for v in profiles.values()), profiles
    assert any(v.get("seconds") == 0.0 for v in profiles.values()), profiles


def _assert_helpers_gated(
    tmp_path: Path, flags: tuple[str, ...], gpus: str, env: dict[str, str]
) -> optuna.Study:
    storage = sqlite_url(tmp_path)
    out = tuner("run", *flags, "--storage", storage, "--gpus", gpus, "--json", env=env)
    assert out.returncode == 0, out.stderr[-4000:]
    rec = json.loads(out.stdout)
    study = optuna.load_study(study_name=rec["study"], storage=storage)
    attrs = study.user_attrs
    sessions = [v["phases"] for k, v in attrs.items() if k.startswith(keys.TIME_PREFIX)]
    gates = ("gate_reference", "gate_envelope", "gate_twin", "gate_config")
    # A session that gated and ran no final round: a helper's, not the finalizer's.
    helpers = [p for p in sessions if p["final_round"] == 0 and sum(p[g] for g in gates) > 0]
    assert helpers, (sessions, out.stderr[-3000:])
    # The envelope was measured once in the whole job, whoever measured it.
    assert sum(1 for p in sessions if p["gate_envelope"] > 0) == 1, sessions
    # Every claim was given back, and the recommendation's gate verdict is stored.
    claims = {k: v for k, v in attrs.items() if k.startswith("claim/")}
    assert claims and set(claims.values()) == {""}
    assert rec["config"] is not None and rec["parity"]["passed"]
    return study
