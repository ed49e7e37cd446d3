"""`python -m tuner run / best / export / studies` as a user runs them.

One real subprocess per kind of check (starting Python and torch costs ~2.5 s on the CI machine);
the many bad-flag cases also run in-process through `tuner.__main__.main`, the function the
subprocess runs, with the real storage and the real workloads.
"""

from __future__ import annotations

import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import optuna
import pytest
from rich.console import Console

from tests.tuner.conftest import Finished
from tests.tuner.tiny import RUN_FLAGS, WORKLOADS, load, sqlite_url
from tests.tuner.workloads_for_tests import INJECTED, INJECTED_AT
from trainers import LoopConfig
from tuner.__main__ import main
from tuner.evidence import export, reader, render
from tuner.store import keys

REPO = Path(__file__).resolve().parents[2]


def tuner(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tuner", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        env=env,
    )


# A progress line, as `python -m tuner run` prints them where stderr is not a terminal.
PROGRESS_LINE = re.compile(r"^\[ *\d+\.\d s\] ")


def without_progress(err: str) -> str:
    """stderr without its progress lines: what is left is the errors."""
    return "".join(line for line in err.splitlines(keepends=True) if not PROGRESS_LINE.match(line))


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """The command in-process; stderr without its progress lines (a test of those reads them
    from `main` itself)."""
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, without_progress(out.err)


def words(text: str) -> str:
    """Rich wraps lines at the console width: compare text with its whitespace collapsed."""
    return " ".join(text.split())


# -- run, end to end in a subprocess ---------------------------------------------------------


def test_with_json_what_the_users_code_prints_goes_to_stderr(tmp_path: Path) -> None:
    """A factory's print() made `--json`'s stdout unreadable (a new user's trial)."""
    flags = list(RUN_FLAGS)
    flags[flags.index("--workload") + 1] = "tests.trainers.own_workloads:printing"
    out = tuner("run", *flags, "--trials", "1", "--json", "--storage", sqlite_url(tmp_path))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["config"] is not None
    assert "building model for tiny seed=0" in out.stderr
    without = tuner("run", *flags, "--trials", "1", "--storage", sqlite_url(tmp_path))
    assert "building model for tiny seed=0" in without.stdout
    # `train --json` too (a probe, 2026-12-06: its stdout began with the factory's line).
    trained = tuner(
        "train", "--workload", "tests.trainers.own_workloads:printing", "--device", "cpu",
        "--steps", "4", "--warmup", "1", "--windows", "2", "--json",
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    assert json.loads(trained.stdout)["steps"] == 4
    assert "building model for tiny seed=0" in trained.stderr


def test_the_jobs_clock_starts_with_the_command_not_after_the_imports(tmp_path: Path) -> None:
    """The job's time aim is the user's wall clock: the seconds spent loading PyTorch and Optuna
    (about 3 s here, 5-7 s on a GPU machine) count. Until 2026-12-04 the clock started when the
    study was opened, and a cold 1B job ended 18 s past what its own clock said. The session's
    stored wall time runs at least to the final round's last line, stamped from the command's
    start."""
    out = tuner("run", *RUN_FLAGS, "--trials", "1", "--json", "--storage", sqlite_url(tmp_path))
    assert out.returncode == 0, out.stderr
    stamps = {
        line.split("] ", 1)[1].split(":")[0]: float(line[1:].split(" s]")[0])
        for line in out.stderr.splitlines()
        if PROGRESS_LINE.match(line)
    }
    assert stamps["building the workload, then opening the study in sqlite"] > 0.5, stamps
    assert json.loads(out.stdout)["time"]["wall_s"] >= stamps["final round"] - 0.05, stamps


def test_run_json_in_a_subprocess_uses_tuner_storage(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    env = {**os.environ, "TUNER_STORAGE": storage}
    out = tuner("run", *RUN_FLAGS, "--trials", "2", "--study", "cli", "--json", "--quiet", env=env)
    assert out.returncode == 0, out.stderr
    assert out.stderr == ""  # --quiet: no progress
    rec = json.loads(out.stdout)
    for key in (
        "study",
        "config",
        "throughput",
        "speedup",
        "ties",
        "fingerprint",
        "trial_counts",
        "gpu_seconds",
    ):
        assert key in rec, key
    assert rec["study"] == "cli"
    assert LoopConfig.from_dict(rec["config"]).num_workers == 0  # pinned by --fix
    assert len(rec["throughput"]["ci95"]) == 2
    assert set(rec["speedup"]) == {"pytorch-default", "seed-baseline"}
    assert all(len(s["ci95"]) == 2 for s in rec["speedup"].values())
    assert rec["trial_counts"] == {
        "complete": 2,
        "failed": 0,
        "pruned": 0,
        "interrupted": 0,
        "running": 0,
        "waiting": 0,
    }
    assert "no effect" in rec["note"]
    # The study is in $TUNER_STORAGE (no --storage given), not in ./tuner.db.
    assert len(load(storage, "cli").trials) == 2
    assert load(storage, "cli").user_attrs["recommendation"] == rec


# -- progress --------------------------------------------------------------------------------


def test_a_run_logged_to_a_file_prints_its_first_line_within_5_s_then_one_per_trial(
    tmp_path: Path,
) -> None:
    """stdout and stderr to one file, as `nohup` or CI does: plain progress lines, the first
    within 5 s of the start (issue 29: a run printed nothing for 11 minutes), one per trial with
    its number, its config in short, its result and seconds, and a last one whose figure is the
    summary's."""
    log = tmp_path / "run.log"
    storage = sqlite_url(tmp_path)
    command = [sys.executable, "-m", "tuner", "run", *RUN_FLAGS, "--trials", "3"]
    with log.open("w") as sink:
        started = time.monotonic()
        proc = subprocess.Popen(
            [*command, "--study", "log", "--storage", storage],
            cwd=REPO,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
        first_after = None
        while proc.poll() is None and time.monotonic() - started < 300:
            if first_after is None and log.read_text().strip():
                first_after = time.monotonic() - started
            time.sleep(0.05)
        proc.wait(timeout=10)
    text = log.read_text()
    assert proc.returncode == 0, text
    assert first_after is not None and first_after < 5.0, (first_after, text)
    lines = [line for line in text.splitlines() if PROGRESS_LINE.match(line)]
    assert lines[0].endswith("tuning mlp / tiny on device cpu: loading PyTorch and Optuna")
    assert lines[1].endswith(f"building the workload, then opening the study in {storage}")
    assert any("new study log: up to 3 trials" in line for line in lines)
    trials = [line for line in lines if re.search(r"\] trial \d+ \(\d/3\) ", line)]
    assert len(trials) == 3, lines
    for line in trials:
        # Each trial: its state, then its figure or its reason, its config in words, seconds.
        assert re.search(r"\) (complete: [\d,.]+ samples/s|pruned: |failed: )", line), line
        assert re.search(r" \[[^\]]+\] in \d+\.\d s", line), line
        assert "0 workers" not in line  # only what differs from the PyTorch default is named
    assert any("final round" in line for line in lines)
    # Each check of the gate said as it starts and once judged, with its seconds (at 1B one
    # takes minutes, and a log was silent through them): one of each per stored verdict.
    study = load(storage, "log")
    verdicts = [k for k in study.user_attrs if k.startswith(keys.PARITY_PREFIX)]
    checking = [line for line in lines if "] gate: checking [" in line]
    judged = [
        line for line in lines if re.search(r"\] gate: \[.+\] (passed|failed) in \d+ s", line)
    ]
    assert len(checking) == len(judged) == len(verdicts) > 0, lines
    assert any(re.search(r"\] final round: \d+ s$", line) for line in lines), lines
    done = lines[-1]
    assert "] done: recommended " in done, lines
    rec = load(storage, "log").user_attrs["recommendation"]
    figure = float(re.search(r" at ([\d,.]+) samples/s", done)[1].replace(",", ""))
    assert figure == pytest.approx(rec["throughput"]["median"], abs=0.051)
    # The summary after the log gives the same figure (2 decimals there, 1 in the log).
    assert f"{rec['throughput']['median']:,.2f} samples/s" in text.split(done)[1]


def _signalled_in_its_gate(
    tmp_path: Path, study: str, sig: int
) -> tuple[subprocess.Popen[bytes], str, str]:
    """A real `run` signalled once its gate runs (inside a RUNNING trial): its process (ended),
    its stderr and its storage."""
    log, storage = tmp_path / "run.log", sqlite_url(tmp_path)
    command = [sys.executable, "-m", "tuner", "run", *RUN_FLAGS, "--trials", "20"]
    with log.open("w") as sink:
        proc = subprocess.Popen(
            [*command, "--study", study, "--storage", storage], cwd=REPO, stderr=sink
        )
        try:
            started = time.monotonic()
            while "gate: checking [" not in log.read_text() and time.monotonic() - started < 120:
                time.sleep(0.02)
            proc.send_signal(sig)
            proc.wait(timeout=60)
        finally:
            proc.kill()
            proc.wait(timeout=60)
    return proc, log.read_text(), storage


def test_sigterm_ends_a_run_as_ctrl_c_does(tmp_path: Path) -> None:
    """`timeout`, `kill` and `docker stop` send SIGTERM: the trial it lands in is failed as
    interrupted and the resume command printed, exit 130. It had ended the process at once and
    left that trial RUNNING in the study for good, resumed or not (a probe, 2026-12-07)."""
    proc, text, storage = _signalled_in_its_gate(tmp_path, "term", signal.SIGTERM)
    assert proc.returncode == 130, text
    assert "interrupted: " in text and "to resume it: python -m tuner run" in text, text
    trials = load(storage, "term").trials
    assert trials and not [t for t in trials if t.state == optuna.trial.TrialState.RUNNING]
    assert trials[-1].user_attrs.get(keys.FAILURE_REASON) == "interrupted"


def test_an_interrupt_before_a_trial_is_measured_still_fails_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C or SIGTERM while a trial's config was drawn, after Optuna's ask and before the
    trial's own handler, had left it RUNNING (a probe, 2026-12-07)."""
    from tuner.search.trials import TrialRunner

    drawn = TrialRunner._prepare

    def interrupted(self: TrialRunner, trial: optuna.Trial) -> None:
        drawn(self, trial)
        raise KeyboardInterrupt

    monkeypatch.setattr(TrialRunner, "_prepare", interrupted)
    storage = sqlite_url(tmp_path)
    flags = ["run", *RUN_FLAGS, "--trials", "3", "--study", "drawn", "--storage", storage]
    assert main(flags) == 130
    assert "interrupted: 0 trials of this run are stored" in capsys.readouterr().err
    [trial] = load(storage, "drawn").trials
    assert trial.state.name == "FAIL" and trial.user_attrs[keys.FAILURE_REASON] == "interrupted"


def test_a_signal_whose_interrupt_python_swallowed_stops_the_run_at_the_next_poll() -> None:
    """A KeyboardInterrupt raised inside a callback Python ignores (a weakref's, the garbage
    collector's) was lost, and the run went on to its end with exit 0 (a probe, 2026-12-07):
    the search's poll raises it again."""
    from tuner.cli import _terminated_as_interrupted

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    for sig in before:
        with _terminated_as_interrupted() as poll:
            assert poll() is False
            try:
                os.kill(os.getpid(), sig)
                time.sleep(5)  # the handler raises here, at once
            except KeyboardInterrupt:
                pass  # swallowed, as "Exception ignored in ..." swallows it
            with pytest.raises(KeyboardInterrupt):
                poll()
    assert {sig: signal.getsignal(sig) for sig in before} == before  # handed back


def test_a_resume_fails_the_trial_of_a_run_that_was_killed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """SIGKILL or the out-of-memory killer gives a run no chance to fail its trial: it stayed
    RUNNING for good, resumed or not (2026-12-07). The trial names its process; a resume on the
    same host finds it gone, fails the trial as interrupted (run again, not counted) and says so.
    """
    proc, _, storage = _signalled_in_its_gate(tmp_path, "killed", signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL
    [left] = [t for t in load(storage, "killed").trials if t.state.name == "RUNNING"]
    assert left.user_attrs[keys.PROCESS].split(":")[1] == str(proc.pid)
    flags = ["run", *RUN_FLAGS, "--trials", "20", "--study", "killed", "--storage", storage]
    assert main([*flags, "--timeout", "1"]) in (0, 1)
    said = capsys.readouterr().err
    assert f"trial {left.number}: left RUNNING by a run that was killed" in said, said
    after = load(storage, "killed").trials[left.number]
    assert after.state.name == "FAIL"
    assert after.user_attrs[keys.FAILURE_REASON].startswith("interrupted: its process ended")
    assert after.user_attrs[keys.FAILURE_KIND] == "interrupted"


def test_fp16_autocast_over_a_float16_model_is_refused_naming_the_flag(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The gradient scaler cannot unscale float16 gradients: every config had failed with
    "Attempting to unscale FP16 gradients.", said as the workload's fault (a probe,
    2026-12-07). One line naming --precision, before a study is stored."""
    workload = ["--workload", "tests.tuner.workloads_for_tests:half_parameters"]
    storage = sqlite_url(tmp_path)
    flags = ["run", *workload, "--device", "cpu", "--trials", "1", "--storage", storage]
    assert main([*flags, "--precision", "fp16-autocast", "--study", "half"]) == 2
    err = capsys.readouterr().err
    assert "error: --precision: precision='fp16-autocast' is invalid: allowed a model whose " in err
    assert "(its weight is float16: the gradient scaler unscales float32 gradients)" in err
    assert "half" not in optuna.get_all_study_names(storage)


def test_quiet_prints_no_progress_and_without_it_stderr_has_the_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = sqlite_url(tmp_path)
    flags = ["run", *RUN_FLAGS, "--trials", "1", "--storage", storage]
    assert main([*flags, "--study", "quiet", "--quiet"]) == 0
    quiet = capsys.readouterr()
    assert quiet.err == ""
    assert "1 complete, 0 failed, 0 pruned" in words(quiet.out)  # the summary still is printed
    assert main([*flags, "--study", "loud", "--json"]) == 0
    loud = capsys.readouterr()
    assert json.loads(loud.out)["study"] == "loud"  # progress stays out of the JSON
    progress = loud.err.splitlines()
    assert progress and all(PROGRESS_LINE.match(line) for line in progress), loud.err
    assert any(re.search(r"\] trial 0 \(1/1\) ", line) for line in progress), loud.err


def test_a_cpu_run_given_no_budget_flags_gets_the_cpu_defaults(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a CPU: a 30 s search budget, 1 final round, no profiles, unless the flags say otherwise
    (a GPU keeps its own defaults: `run_study`'s)."""
    storage = sqlite_url(tmp_path)
    pairs = dict(zip(RUN_FLAGS[::2], RUN_FLAGS[1::2], strict=True))
    flags = [
        w
        for k, v in pairs.items()
        if k not in ("--final-rounds", "--profile", "--timeout")
        for w in (k, v)
    ]
    base = ["run", *flags, "--trials", "1", "--storage", storage]
    assert main([*base, "--study", "defaults", "--json"]) == 0
    err = capsys.readouterr().err
    assert (
        "on a CPU: search budget 30 s (--timeout), 1 final round (--final-rounds), no profiles "
        "(--profile); the flags in brackets set others"
    ) in err
    assert "final round 1/1" in err and "final round 1/3" not in err
    assert "profiling" not in err
    attrs = load(storage, "defaults").user_attrs
    assert not [k for k in attrs if k.startswith("profile/")]
    assert attrs["recommendation"].get("explanation") is None  # no profile: no verdict to explain
    assert main([*base, "--study", "given", "--final-rounds", "2", "--timeout", "100"]) == 0
    err = capsys.readouterr().err
    assert "on a CPU: no profiles (--profile)" in err
    # Two rounds at most: the second runs unless the first left the decision as the search had it.
    assert "final round 1/2" in err and "final round 1/1" not in err
    assert ("final round 2/2" in err) != ("round 1 left the decision as it was" in err)


# -- storage paths ------------------------------------------------------------------------------


def test_an_sqlite_path_in_a_missing_folder_is_one_line_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """No folder is made for a database: a mistyped path must not create folders anywhere."""
    missing = tmp_path / "missing" / "x"
    url = f"sqlite:///{missing}/t.db"
    code, out, err = run_main(capsys, "run", *RUN_FLAGS, "--storage", url)
    assert (code, out) == (2, "")
    assert err == (
        f"error: --storage: the folder {missing} of {url!r} does not exist; create it first "
        f"(mkdir -p {missing}): an SQLite file's folder must exist: streamtune creates the file "
        "and its <name>-artifacts/ folder beside it, never the folders on the way to it\n"
    )
    assert not (tmp_path / "missing").exists()
    # Once the folder exists, the same URL works.
    missing.mkdir(parents=True)
    code, _, err = run_main(capsys, "run", *RUN_FLAGS, "--trials", "1", "--storage", url)
    assert (code, err) == (0, "")
    assert (missing / "t.db").is_file()


def test_an_unusable_sqlite_path_in_a_real_process_is_one_line_without_traceback() -> None:
    """`/proc/nope` cannot be created by anyone: one line naming --storage and the path, exit 2
    (issue 29: a 67-line traceback)."""
    out = tuner("run", *RUN_FLAGS, "--storage", "sqlite:////proc/nope/t.db")
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    assert "Traceback" not in out.stderr
    assert without_progress(out.stderr).splitlines() == [
        "error: --storage: the folder /proc/nope of 'sqlite:////proc/nope/t.db' does not exist; "
        "create it first (mkdir -p /proc/nope): an SQLite file's folder must exist: streamtune "
        "creates the file and its <name>-artifacts/ folder beside it, never the folders on the "
        "way to it"
    ]
    assert not Path("/proc/nope").exists()


def test_the_storage_rule_is_in_the_help() -> None:
    out = tuner("run", "--help", env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0
    assert "never a missing folder on the way to it" in words(out.stdout)


# -- run, in-process -------------------------------------------------------------------------


def test_run_summary_says_stream_settings_have_no_effect_on_a_cpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = sqlite_url(tmp_path)
    code, out, _ = run_main(
        capsys, "run", *RUN_FLAGS, "--trials", "1", "--study", "human", "--storage", storage
    )
    assert code == 0
    text = words(out)
    assert "stream, event and pinned-memory settings have no effect" in text
    assert "vs pytorch-default" in text and "vs seed-baseline" in text
    assert "1 complete, 0 failed, 0 pruned" in text


def test_run_objectives_and_max_memory_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = sqlite_url(tmp_path)
    code, out, _ = run_main(
        capsys,
        "run",
        *RUN_FLAGS,
        "--trials",
        "2",
        "--study",
        "mem",
        "--storage",
        storage,
        "--objectives",
        "throughput, memory",
        "--max-memory",
        "1000000000",
        "--json",
    )
    assert code == 0
    rec = json.loads(out)
    assert isinstance(rec["pareto"], list)
    assert rec["max_memory_bytes"] == 1_000_000_000
    assert load(storage, "mem").user_attrs["streamtune"]["objectives"] == ["throughput", "memory"]
    # What a CPU cannot do with them is said in the summary, as the JSON's note says it: it had
    # been hidden with the CPU note it follows (a probe, 2026-12-07).
    code, out, _ = run_main(capsys, "best", "--study", "mem", "--storage", storage)
    assert code == 0
    assert "peak memory is measured on a CUDA device only" in rec["note"]
    said = words(out)
    assert "note: peak memory is measured on a CUDA device only" in said, said


def test_resuming_another_preset_is_one_line_naming_study(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = sqlite_url(tmp_path)
    assert (
        run_main(
            capsys,
            "run",
            *RUN_FLAGS,
            "--trials",
            "1",
            "--study",
            "s",
            "--storage",
            storage,
            "--json",
        )[0]
        == 0
    )
    code, out, err = run_main(
        capsys,
        "run",
        *RUN_FLAGS,
        "--trials",
        "1",
        "--study",
        "s",
        "--storage",
        storage,
        "--preset",
        "small",
    )
    assert code == 2
    assert out == ""
    assert err == (
        "error: --study: 's' was made with preset='tiny', this run has 'small'; "
        "resume it with the same settings or choose another --study\n"
    )
    # Another timing protocol likewise: it had mixed two in one final round, and said the
    # baselines' change as drift of the machine (a probe, 2026-12-07).
    flags = [*RUN_FLAGS, "--trials", "1", "--study", "s", "--storage", storage]
    code, out, err = run_main(capsys, "run", *flags, "--windows", "4")
    assert code == 2
    assert err == (
        "error: --study: 's' was made with protocol={windows: 3}, this run has {windows: 4}; "
        "resume it with the same settings or choose another --study\n"
    )
    assert len(load(storage, "s").trials) == 1


def test_a_failing_workload_is_reported_not_raised(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = sqlite_url(tmp_path)
    flags = [f for f in RUN_FLAGS if f != "mlp"]
    flags[flags.index("--workload") + 1 : flags.index("--workload") + 1] = [
        f"{WORKLOADS}:raises_in_loss"
    ]
    code, out, _ = run_main(
        capsys, "run", *flags, "--trials", "1", "--study", "broken", "--storage", storage
    )
    # No recommendation: not a success (issue 56), and each failure's cause is in the summary.
    assert code == 1
    assert "recommendation none: every final-round measurement failed" in words(out)
    for name in ("pytorch-default", "seed-baseline"):
        assert f"{name} failed cuda: RuntimeError at " in words(out), out
        # The path is one word, folded (not cut) where it is wider than the cell (CI's clone
        # lies deeper than a checkout here): compare it with all whitespace removed.
        assert f"workloads_for_tests.py:{INJECTED_AT}:" in "".join(out.split()), out
        assert INJECTED in words(out), out
    code, out, err = run_main(capsys, "export", "--study", "broken", "--storage", storage)
    # Exits as `best` does (it had exited 2, a usage error's code), pointing where the failures
    # are ("(see failures)" had pointed at nothing this command prints).
    assert code == 1
    assert err == (
        "error: study 'broken' recommends no config to export: every final-round measurement "
        "failed (`python -m tuner best --study broken`, with this --storage, names each "
        "failure)\n"
    )
    # `best` shows the same record, and is no success either (it exited 0).
    code, out, _ = run_main(capsys, "best", "--study", "broken", "--storage", storage)
    assert code == 1 and "recommendation none" in words(out)


# -- best, export, studies -------------------------------------------------------------------


def test_best_prints_the_stored_recommendation(
    finished: Finished, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_main(
        capsys, "best", "--study", finished.study, "--storage", finished.storage, "--json"
    )
    assert code == 0
    assert json.loads(out) == reader.recommendation(finished.storage, finished.study).to_dict()
    code, out, _ = run_main(
        capsys, "best", "--study", finished.study, "--storage", finished.storage
    )
    assert code == 0
    text = words(out)
    assert f"recommended {finished.rec['source']}:" in text
    assert "4 complete, 0 failed, 0 pruned" in text
    assert "no effect" in text


@pytest.mark.parametrize("fmt", ["json", "env", "python"])
def test_export_formats(finished: Finished, capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    code, out, _ = run_main(
        capsys, "export", "--study", finished.study, "--storage", finished.storage, "--format", fmt
    )
    assert code == 0
    expected = LoopConfig.from_dict(finished.rec["config"])
    if fmt == "json":
        assert LoopConfig.from_dict(json.loads(out)) == expected
    elif fmt == "env":
        variables = dict(line.split("=", 1) for line in out.strip().splitlines())
        assert export.config_from_env(variables) == expected
    else:
        namespace: dict[str, Any] = {}
        exec(out, namespace)
        assert namespace["config"] == expected


def test_the_printed_export_command_reads_the_storage_given_and_never_prints_a_password(
    finished: Finished, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Printed without --storage, `export` had read ./tuner.db: "no database at ...".
    flags = ("--study", finished.study, "--storage", finished.storage)
    code, out, _ = run_main(capsys, "best", *flags)
    assert code == 0
    (command,) = [line for line in out.splitlines() if line.startswith("python -m tuner export")]
    words_of = shlex.split(command)
    assert words_of[words_of.index("--storage") + 1] == finished.storage
    code, exported, _ = run_main(capsys, *words_of[3:])  # the printed command, as printed
    assert code == 0 and finished.study in exported
    monkeypatch.setenv("TUNER_STORAGE", finished.storage)  # the environment: read as it is
    code, out, _ = run_main(capsys, "best", "--study", finished.study)
    assert code == 0 and "--storage" not in out
    console = Console(file=io.StringIO(), width=300)
    rec = reader.recommendation(finished.storage, finished.study)
    render.recommendation(console, rec, storage="postgresql://me:s3cret@127.0.0.1/db")
    shown = console.file.getvalue()
    assert "--storage 'postgresql://me:***@127.0.0.1/db'" in shown and "s3cret" not in shown


def test_studies_lists_the_study(
    finished: Finished, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = run_main(capsys, "studies", "--storage", finished.storage, "--json")
    assert code == 0
    (row,) = json.loads(out)
    assert row["study"] == finished.study
    assert row["trials"]["complete"] == 4
    monkeypatch.setenv("TUNER_STORAGE", finished.storage)  # no --storage: $TUNER_STORAGE
    code, out, _ = run_main(capsys, "studies")
    assert code == 0
    assert finished.study in out
    assert "4/0/0" in out
    best = f"{finished.rec['throughput']['median']:,.1f} (final round)"
    assert best in out, out  # a search trial's figure would say which trial


# -- bad flags -------------------------------------------------------------------------------

BAD_RUN_FLAGS = [
    (["--trials", "0"], "error: --trials: trials=0 is invalid"),
    # Optuna's sampler had raised its own ValueError, a traceback after the workload was built.
    (["--seed", "-1"], "error: --seed: seed=-1 is invalid: allowed 0 to 4294967295"),
    (["--seed", str(2**32)], "error: --seed: seed=4294967296 is invalid: allowed 0 to"),
    # An in-memory database: the study was gone when the run ended.
    # Said as typed (SQLAlchemy's rendering had shown sqlite:///%3Amemory%3A).
    (["--storage", "sqlite:///:memory:"], "error: --storage: 'sqlite:///:memory:' keeps "),
    (["--storage", "sqlite:///"], "error: --storage: 'sqlite:///' keeps nothing after the run"),
    (["--objectives", "memory"], "error: --objectives: "),
    (["--space", "nope"], "error: --space/--fix: space='nope' is invalid"),
    (["--fix", "num_streams=9"], "error: --space/--fix: num_streams=9 is invalid"),
    (["--sampler", "grid"], "error: --sampler: sampler='grid' is invalid"),
    (["--max-memory", "0"], "error: --max-memory: "),
    # The API refused it; the CLI had taken it as a cap.
    (["--max-memory", str(2**50 + 1)], "error: --max-memory: max_memory_bytes=1125899906842625 "),
    (["--timeout", "0"], "error: --timeout: "),
    (["--patience", "-1"], "error: --patience: patience=-1 is invalid"),
    (
        ["--patience", "3", "--objectives", "throughput,memory"],
        "error: --patience: patience=3 is invalid",
    ),
    (["--top-k", "0"], "error: --top-k: "),
    (["--windows", "0"], "error: --windows: "),
    (["--window-steps", "0"], "error: --window-steps: "),
    # A baseline is measured whole, outside the budget: it had run on with no line.
    (["--warmup", "1000000"], "error: --warmup: warmup=1000000 is invalid: allowed an integer"),
    (["--study", ""], "error: --study: '' is invalid: allowed a name that is not blank"),
    (["--study", "a "], "error: --study: 'a ' is invalid: allowed a name without spaces"),
    (["--study", "x" * 513], "error: --study: 'xxxx"),
    (["--study", "streamtune-gate-memo/x"], "error: --study: 'streamtune-gate-memo/x' is inv"),
    (["--study", "a/b"], "error: --study: 'a/b' is invalid: allowed a name without '/'"),
    (["--parity-steps", "1"], "error: --parity-steps: "),
    (["--matmul-precision", "low"], "error: --matmul-precision: "),
    (["--device", "tpu"], "error: --device: "),
    (["--preset", "huge"], "error: --preset: preset='huge' is invalid"),
    (["--workload", "nope"], "error: --workload: workload='nope' is invalid"),
    (["--fix", "num_streams"], "error: --space/--fix: fix='num_streams' is invalid"),
    (
        ["--storage", "mysql://u@h/x"],
        "error: --storage: 'mysql://u@h/x' is not a supported database",
    ),
    (["--trials", "x"], "error: Invalid value for '--trials'"),
]


@pytest.mark.parametrize(("args", "start"), BAD_RUN_FLAGS)
def test_a_bad_run_flag_is_one_line_naming_it_and_stores_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], start: str
) -> None:
    storage = sqlite_url(tmp_path)
    code, out, err = run_main(
        capsys,
        "run",
        "--workload",
        "mlp",
        "--preset",
        "tiny",
        "--device",
        "cpu",
        "--storage",
        storage,
        *args,
    )
    assert code == 2
    assert out == ""
    assert err.startswith(start)
    assert err.count("\n") == 1 and err.endswith("\n"), err
    if "--storage" not in args:
        assert optuna.get_all_study_names(storage) == []


def test_a_service_jobs_study_is_not_tuned_further_by_the_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Trials the CLI added to a job's study were the job's, while its row and /best kept the
    job's recommendation and the study's /best gave another (a user's probe, 2026-12-06)."""
    from tuner.request import JobSpec
    from tuner.service.jobstore import JobStore

    storage = sqlite_url(tmp_path)
    store = JobStore(storage)
    try:
        job = store.create(JobSpec(workload="mlp", preset="tiny", device="cpu"), owner="alice")
    finally:
        store.close()
    flags = ["--workload", "mlp", "--preset", "tiny", "--device", "cpu", "--storage", storage]
    code, out, err = run_main(capsys, "run", *flags, "--study", job.study)
    assert code == 2 and out == ""
    assert err == (
        f"error: --study: study {job.study!r} is service job {job.id}'s (queued): its trials "
        "and recommendation are the job's; tune it again as a new job (POST /v1/jobs), or here "
        "under another --study\n"
    )
    assert optuna.get_all_study_names(storage) == []


def test_best_and_export_of_a_service_jobs_study_say_what_its_job_says(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """They had advised `run --study job-...` again, which the CLI refuses for a job's study (a
    probe, 2026-12-07): they say the job's status and what to do, as the API's /best does."""
    from tuner.request import JobSpec
    from tuner.service.jobstore import JobStore

    storage = sqlite_url(tmp_path)
    store = JobStore(storage)
    try:
        job = store.create(JobSpec(workload="mlp", preset="tiny", device="cpu"), owner="alice")
        optuna.create_study(storage=storage, study_name=job.study)  # its workers opened it
        for command in ("best", "export"):
            code, _, err = run_main(capsys, command, "--study", job.study, "--storage", storage)
            assert code == 1 and "run `python -m tuner run" not in err
            assert f"has no recommendation yet: its job {job.id} is queued (GET /v1/jobs/" in err
        store.cancel(job.id)
    finally:
        store.close()
    code, _, err = run_main(capsys, "best", "--study", job.study, "--storage", storage)
    assert f"its job {job.id} ended cancelled before its final round; POST the job again" in err
    # A study of the CLI's own keeps its advice.
    optuna.create_study(storage=storage, study_name="own")
    code, _, err = run_main(capsys, "best", "--study", "own", "--storage", storage)
    # With the workload and settings it was made with: `--study own` alone names the default
    # workload, which the study refuses (a user's probe, 2026-12-07).
    assert "run the command it printed when it stopped ('to resume it: ...')" in err
    assert "`python -m tuner run --study own` with the workload, preset and settings" in err


def test_a_space_file_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    """Windows editors write one; the service's JSON body took it, the file was refused."""
    from tuner.search.spaces.own import own_space

    path = tmp_path / "space.json"
    path.write_bytes(b"\xef\xbb\xbf" + b'{"num_streams": [1, 2]}')
    space = own_space(str(path))
    assert space is not None and set(space.params) == {"num_streams"}


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["best", "--study", "missing"],
            "error: --study: no study named 'missing' in this storage (studies: none)",
        ),
        (
            ["export", "--study", "missing"],
            "error: --study: no study named 'missing' in this storage (studies: none)",
        ),
        (["best"], "error: Missing option '--study'."),
    ],
)
def test_reading_a_missing_study_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], line: str
) -> None:
    url = sqlite_url(tmp_path)
    optuna.storages.RDBStorage(url)  # a database with no study in it
    code, out, err = run_main(capsys, *args, "--storage", url)
    assert (code, out, err) == (2, "", line + "\n")


@pytest.mark.parametrize(
    "command", [["best", "--study", "s"], ["studies"], ["export", "--study", "s"]]
)
def test_reading_a_database_that_is_not_there_is_one_line_and_creates_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    # Each had left an empty database behind and said "(studies: none)" (2026-12-02).
    url = sqlite_url(tmp_path)
    code, out, err = run_main(capsys, *command, "--storage", url)
    assert (code, out) == (2, "")
    assert err.startswith("error: --storage: no database at ") and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []
    # A file that is not a database, and a URL whose path SQLite would read as a host.
    (tmp_path / "notes.txt").write_text("not a database")
    code, _, err = run_main(capsys, *command, "--storage", f"sqlite:///{tmp_path}/notes.txt")
    assert code == 2 and err.endswith(": file is not a database\n"), err
    code, _, err = run_main(capsys, *command, "--storage", "sqlite://tmp/x.db")
    assert code == 2 and "names a host ('tmp')" in err, err


def test_a_bad_export_format_is_one_line(
    finished: Finished, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run_main(
        capsys,
        "export",
        "--study",
        finished.study,
        "--storage",
        finished.storage,
        "--format",
        "yaml",
    )
    assert code == 2
    assert err == "error: --format: 'yaml' is invalid: allowed json, env, python\n"


@pytest.mark.slow
def test_bad_flags_in_real_processes_exit_2_with_one_line_and_no_traceback(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    optuna.storages.RDBStorage(storage)  # `best` reads a database that is there
    cases = {
        "--trials": ["run", "--trials", "0"],
        "--objectives": ["run", "--objectives", "memory"],
        "--space": ["run", "--space", "nope"],
        "--fix": ["run", "--fix", "num_streams=9"],
        "--sampler": ["run", "--sampler", "grid"],
        "--study": ["best", "--study", "missing"],
    }
    common = ["--storage", storage]
    run_args = ["--workload", "mlp", "--preset", "tiny", "--device", "cpu"]
    procs = {
        flag: subprocess.Popen(
            [sys.executable, "-m", "tuner", *args, *common, *(run_args if "run" in args else [])],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for flag, args in cases.items()
    }
    for flag, proc in procs.items():
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 2, (flag, err)
        assert out == "", flag
        lines = without_progress(err).splitlines()
        assert len(lines) == 1, (flag, err)
        assert lines[0].startswith("error: ") and flag in lines[0], (flag, err)
        assert "Traceback" not in err


# -- library models: one command each, in bf16 autocast ------------------------------------------

LIBRARY_RUNS = [
    ("torchvision", "torchvision:resnet18", ("--model-arg", "classes=4")),
    ("timm", "timm:resnet10t", ()),
    ("transformers", "hf:causal-lm", ("--model-arg", "arch=llama", "--model-arg", "layers=1")),
]


@pytest.mark.models
@pytest.mark.slow
@pytest.mark.parametrize(
    ("library", "workload", "extra"), LIBRARY_RUNS, ids=[w for _, w, _ in LIBRARY_RUNS]
)
def test_a_library_model_is_tuned_in_bf16_by_one_command(
    tmp_path: Path, library: str, workload: str, extra: tuple[str, ...]
) -> None:
    pytest.importorskip(library)
    flags = list(RUN_FLAGS)
    flags[flags.index("--workload") + 1] = workload
    out = tuner(
        "run",
        *flags,
        *extra,
        "--trials",
        "2",
        "--precision",
        "bf16-autocast",
        "--json",
        "--storage",
        sqlite_url(tmp_path),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rec = json.loads(out.stdout)
    assert (
        rec["config"] is not None
        and rec["trial_counts"]["complete"] + rec["trial_counts"]["failed"] == 2
    )
    meta = load(sqlite_url(tmp_path), rec["study"]).user_attrs["streamtune"]
    assert (meta["workload"], meta["precision"]) == (workload, "bf16-autocast")
    assert meta["shape"].startswith(f"{workload}-tiny-") and rec["study"].endswith(
        "-cpu-bf16-autocast"
    )
    bad = tuner(
        "run",
        *flags,
        "--model-arg",
        "no_such_option=1",
        "--trials",
        "1",
        "--storage",
        sqlite_url(tmp_path),
    )
    assert bad.returncode == 2 and "no_such_option" in bad.stderr and "allowed" in bad.stderr


def test_the_resume_command_an_interrupt_prints_resumes_the_study(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`run again with --study NAME` alone ran the default workload, which the study refused
    (a new user's trial, 2026-12-02); the command printed now names what the study must match."""
    import shlex

    from tests.tuner.tiny import options, run_json
    from tuner.search.options import resume_command

    made = options(sqlite_url(tmp_path), "made", trials=1, seed=3, objectives=("throughput",))
    run_json(made)
    command = resume_command(made, "made")
    assert command.startswith("python -m tuner run --study made --workload mlp --preset tiny")
    assert "--seed 3" in command and "--fix num_workers=0" in command
    words = shlex.split(command)[3:]  # past `python -m tuner`
    protocol = ["--warmup", "1", "--windows", "3", "--window-steps", "2", "--final-rounds", "1"]
    code, out, err = run_main(capsys, *words, "--trials", "2", *protocol, "--profile", "none")
    assert code == 0, err
    assert " made (mlp / tiny on cpu)" in out  # the study resumed: no "was made with" refusal
    assert len(load(made.storage or "", "made").trials) > 1


def test_the_resume_command_keeps_the_runs_settings_and_asks_a_trial_when_none_is_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Left out, a resume dropped the memory cap and the tie margin (so could recommend over
    the cap), the random sampler and the measurement windows; interrupted in the final round
    (no trial left) the printed command had no --trials and resumed with up to 40 (a user's
    probe, 2026-12-06)."""
    import shlex

    from tests.tuner.tiny import options, run_json
    from tuner.search.options import resume_command

    made = options(
        sqlite_url(tmp_path),
        "kept",
        trials=2,
        max_memory_bytes=2_000_000_000,
        tie_margin=0.05,
        screen="on",
        patience=3,
    )
    run_json(made)
    command = resume_command(made, "kept", done=2)
    for said in (
        "--trials 1 ",
        "--max-memory 2000000000",
        "--tie-margin 0.05",
        "--sampler random",
        "--screen on",
        "--patience 3",
        "--warmup 1 --windows 3 --window-steps 2",
        "--final-rounds 1",
        "--profile none",
    ):
        assert said in command, said
    assert "--top-k 2" in command and "--baseline-every" not in command  # the default: unsaid
    code, out, err = run_main(capsys, *shlex.split(command)[3:], "--json")
    assert code == 0, err
    resumed = json.loads(out)
    assert (resumed["max_memory_bytes"], resumed["tie_margin"]) == (2_000_000_000, 0.05)
    assert len(load(made.storage or "", "kept").trials) == 3  # one more, not up to 40


def test_the_resume_command_names_typed_pins_and_the_matmul_precision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A job's pins arrive as a mapping and were left out, as was --matmul-precision: the
    # printed command was refused ("made with space=...", "made with precision='tf32'").
    import dataclasses
    import shlex

    from tests.tuner.tiny import options, run_json
    from tuner.search.options import resume_command

    made = options(sqlite_url(tmp_path), "typed", trials=1, objectives=("throughput",))
    made = dataclasses.replace(
        made, fix={"num_workers": 0, "pin_memory": True}, matmul_precision="high"
    )
    run_json(made)
    command = resume_command(made, "typed")
    assert "--fix num_workers=0 --fix pin_memory=true" in command
    assert "--matmul-precision high" in command
    protocol = ["--warmup", "1", "--windows", "3", "--window-steps", "2", "--final-rounds", "1"]
    words = shlex.split(command)[3:]
    code, out, err = run_main(capsys, *words, "--trials", "2", *protocol, "--profile", "none")
    assert code == 0, err
    assert " typed (mlp / tiny on cpu)" in out


def test_models_lists_each_familys_presets_and_options(capsys: pytest.CaptureFixture[str]) -> None:
    # The JSON holds the families' data, not their cross-option check (a function: `--json`
    # failed with "'function' object is not iterable" when it was added).
    code, out, err = run_main(capsys, "models", "--json")
    assert code == 0, err
    families = {family["name"]: family for family in json.loads(out)}
    assert {"torchvision", "timm", "hf:causal-lm"} <= set(families)
    assert all(
        set(f) == {"name", "usage", "description", "options", "presets"} for f in families.values()
    )
    assert families["hf:causal-lm"]["presets"]["tiny"]["heads"] == 2
    # The table says what each preset sets over the defaults it lists.
    code, out, _ = run_main(capsys, "models")
    assert code == 0 and "tiny (batch 2, image 32, classes 10)" in " ".join(out.split())


def test_train_says_a_failing_run_in_one_line_without_a_traceback(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The user's code failing at a step (int32 labels): `train` printed 19 frames of the loop.
    flags = ["--steps", "2", "--warmup", "0", "--windows", "1", "--device", "cpu"]
    workload = "tests.trainers.own_workloads:labels_int32"
    code, out, err = run_main(capsys, "train", "--workload", workload, *flags)
    assert code == 1 and out == ""
    assert err.startswith("error: the run failed: RuntimeError") and err.count("\n") == 1, err
    assert "expected target dtype to be Long" in err and "Traceback" not in err


def test_report_to_a_folder_or_an_unwritable_path_is_one_line(
    finished: Finished, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # Each had raised IsADirectoryError or FileNotFoundError, a traceback after the page was built.
    common = ("report", "--study", finished.study, "--storage", finished.storage)
    for out, said in (
        (str(tmp_path), f"error: --out: {str(tmp_path)!r} is a folder: allowed a file"),
        ("", "error: --out: '' is an empty path: allowed a file, e.g. --out report.html\n"),
        ("  ", "error: --out: '  ' is an empty path: allowed a file"),
        ("/proc/no/r.html", "error: --out: cannot write '/proc/no/r.html': "),
    ):
        code, _, err = run_main(capsys, *common, "--out", out)
        assert code == 2 and err.startswith(said) and err.count("\n") == 1, err
    code, _, _ = run_main(capsys, *common, "--out", str(tmp_path / "r.html"))
    assert code == 0 and (tmp_path / "r.html").read_text().startswith("<!")
