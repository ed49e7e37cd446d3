"""A registered program tuned by `python -m tuner run --program NAME` on the CPU: real Optuna,
real SQLite, the example program run as a process per measurement and per gate run."""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainers import LoopConfig
from trainers.program import load_registry
from tuner.errors import SpaceError
from tuner.search.spaces.named import load_space, program_space, user_fixed

ROOT = Path(__file__).resolve().parents[3]
REGISTRY = ROOT / "examples" / "program" / "programs.json"


def test_a_program_searches_only_the_settings_it_implements() -> None:
    program = load_registry(REGISTRY)["plain-mlp"]
    space = program_space(load_space("auto", cuda=True), program, ())
    assert set(space.params) == {"sync_interval", "pin_memory", "num_workers"}
    assert space.fixed["num_streams"] == 1 and space.fixed["cuda_graph"] is False
    assert space.fixed["compile"] == "none" and space.fixed["non_blocking"] is True
    with pytest.raises(SpaceError, match=r"^num_streams=2 is invalid: allowed 1: program 'plain"):
        pins = ("num_streams=2",)
        program_space(load_space("full", fix=pins, cuda=True), program, user_fixed("full", pins))
    assert LoopConfig(**space.fixed | {"sync_interval": 3}).sync_interval == 3
    # A lever module's lever the space searches (the compiled loss, as `scale` does) is left
    # out, not fixed: the space a program's study stores is the one it stored before the space
    # offered that lever.
    mine = {"sync_interval": [1, 10], "loss": ["model", "compiled"]}
    own = program_space(load_space(mine), program, user_fixed(mine, ()))
    assert set(own.params) == {"sync_interval"} and "loss" not in own.fixed
    assert own.config_from_params({"sync_interval": 10}).get("loss") == "model"


def test_a_program_without_non_blocking_is_searched_and_only_the_users_own_fixes_refused(
    tmp_path: Path,
) -> None:
    """Every named space fixes non_blocking=True: a program that does not implement it (the
    registry module's own example, `"settings": ["sync_interval"]`) had been refused by every
    space, naming --space/--fix the user never gave (a user's probe, 2026-12-06)."""
    registry = tmp_path / "programs.json"
    entry = {"command": ["{python}", "p.py"], "presets": ["tiny"], "settings": ["sync_interval"]}
    registry.write_text(json.dumps({"programs": {"p": entry}}))
    program = load_registry(registry)["p"]
    for name in ("auto", "full", "streams", "compile"):
        space = program_space(load_space(name, cuda=True), program, user_fixed(name, ()))
        assert set(space.params) == {"sync_interval"} and space.fixed["non_blocking"] is False
    pins = ("non_blocking=true",)
    with pytest.raises(SpaceError, match=r"^non_blocking=True is invalid: allowed False: progr"):
        program_space(load_space("auto", fix=pins, cuda=True), program, user_fixed("auto", pins))
    mine = {"sync_interval": [1, 10], "non_blocking": True}  # the user's own space fixes it
    with pytest.raises(SpaceError, match=r"^non_blocking=True is invalid"):
        program_space(load_space(mine), program, user_fixed(mine, ()))


def test_a_program_that_implements_none_of_the_spaces_settings_is_told_so(
    tmp_path: Path,
) -> None:
    """`"settings": []` had been refused with "none of them applies here"."""
    from tuner.search.spaces.pinned import check_left

    registry = tmp_path / "programs.json"
    entry = {"command": ["{python}", "p.py"], "presets": ["tiny"], "settings": []}
    registry.write_text(json.dumps({"programs": {"p": entry}}))
    asked = load_space("streams", cuda=True)
    space = program_space(asked, load_registry(registry)["p"], ())
    with pytest.raises(SpaceError, match=r"left out: program 'p' implements no LoopConfig field"):
        check_left(list(asked.params), space, len(asked.notes))
    # A program that implements some keeps the notes it had: they are part of its stored space.
    plain = program_space(asked, load_registry(REGISTRY)["plain-mlp"], ())
    assert plain.params and plain.notes == asked.notes


@pytest.mark.slow
def test_the_cli_tunes_a_registered_program(tmp_path: Path) -> None:
    storage = f"sqlite:///{tmp_path / 'programs.db'}"
    command = [
        sys.executable, "-m", "tuner", "run", "--program", "plain-mlp", "--preset", "tiny",
        "--trials", "2", "--storage", storage, "--device", "cpu", "--json", "--windows", "2",
        "--window-steps", "4", "--warmup", "1", "--final-rounds", "1", "--top-k", "1",
        "--parity-steps", "5", "--timeout", "600",  # both trials, however slow the machine
    ]  # fmt: skip
    env = {"TUNER_PROGRAMS": str(REGISTRY), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rec = json.loads(done.stdout)
    assert rec["workload"] == "program:plain-mlp" and rec["config"] is not None
    assert rec["parity"]["test"] == "equivalence" and rec["parity"]["passed"]
    assert rec["trial_counts"]["complete"] == 2
    config = LoopConfig.from_dict(rec["config"])
    assert config.num_streams == 1 and config.compile == "none"  # what the program lacks

    unknown = subprocess.run(
        [*command[:5], "nope", *command[6:]],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )
    assert unknown.returncode != 0
    assert "workload='program:nope' is invalid: allowed program:plain-mlp" in unknown.stderr


def test_a_program_is_measured_against_the_baselines_it_implements(tmp_path: Path) -> None:
    """The seed baseline runs two streams: a program without `num_streams` reported it failed
    in every study's final round (a user's probe, 2026-12-06)."""
    from tuner.search.options import BASELINES, baselines_for

    registry = tmp_path / "programs.json"
    entry = {"command": ["{python}", "p.py"], "presets": ["tiny"], "settings": ["sync_interval"]}
    registry.write_text(json.dumps({"programs": {"p": entry}}))
    assert list(baselines_for(1, load_registry(registry)["p"])) == ["pytorch-default"]
    assert baselines_for(1, load_registry(REGISTRY)["plain-mlp"]).keys() == BASELINES.keys() - {
        "seed-baseline"
    }
    assert baselines_for(1) == BASELINES


@pytest.mark.slow
def test_an_edited_program_gets_its_own_study_and_its_study_exports_what_it_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A program's identity had not been recorded: an edited program resumed its old study, its
    trials and verdicts taken for the new code's; the summary offered `export --format python`,
    which failed with "cannot import 'program'" (a user's probe, 2026-12-06)."""
    from tuner.__main__ import main
    from tuner.search.identity import program_identity

    for name in ("programs.json", "plain_loop.py"):
        shutil.copy(REGISTRY.parent / name, tmp_path / name)
    monkeypatch.setenv("TUNER_PROGRAMS", str(tmp_path / "programs.json"))
    storage = f"sqlite:///{tmp_path / 'p.db'}"
    flags = [
        "--program", "plain-mlp", "--preset", "tiny", "--device", "cpu", "--trials", "1",
        "--warmup", "1", "--windows", "2", "--window-steps", "2", "--final-rounds", "1",
        "--top-k", "1", "--parity-steps", "4", "--fix", "num_workers=0", "--timeout", "600",
        "--storage", storage,
    ]  # fmt: skip
    old = "program-plain-mlp-tiny-cpu"
    assert main(["run", *flags]) == 0
    out = capsys.readouterr()
    assert f"export --study {old} --format env" in out.out + out.err
    assert "changed since" not in out.err
    assert main(["export", "--study", old, "--format", "python", "--storage", storage]) != 0
    assert "'python' is invalid for study" in capsys.readouterr().err
    assert main(["export", "--study", old, "--format", "env", "--storage", storage]) == 0
    assert "STREAMTUNE_SYNC_INTERVAL=" in capsys.readouterr().out
    assert main(["train", "--workload", "program:plain-mlp", "--device", "cpu"]) != 0
    assert "is a registered program: it trains itself" in capsys.readouterr().err

    program = load_registry(tmp_path / "programs.json")["plain-mlp"]
    before = program_identity(program)
    with (tmp_path / "plain_loop.py").open("a") as handle:
        handle.write("# an edit\n")
    after = program_identity(program)
    assert after["architecture"] == before["architecture"] and after["code"] != before["code"]
    moved = program_identity(dataclasses.replace(program, command=(*program.command, "--x")))
    assert moved["architecture"] != after["architecture"]
    assert main(["run", *flags]) == 0
    (line,) = [x for x in capsys.readouterr().err.splitlines() if "changed since" in x]
    assert f"the program's files changed since study {old} was measured: new study" in line
    assert f"new study {old}-model-{after['digest']}" in line


def test_a_cancel_stops_a_programs_trial_between_its_windows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job cancelled while its program compiled or hung had held its worker until the
    program's next window or its timeout (`run_program` polled no stop). The trial is told as
    stopped on request (pruned, no windows), not as a failure of its config."""
    from tests.tuner.tiny import load, options
    from tuner.errors import Stopped
    from tuner.evidence.progress import PlainProgress
    from tuner.search.study import run_study
    from tuner.store import keys

    # The example program, hung before its start line from its second run on (the first trial:
    # the pytorch-default baseline is its first run).
    # Each run leaves a file of its own (created whole: a count rewritten in one file could
    # be read empty by the stop asked meanwhile).
    storage = _hanging_program(
        tmp_path,
        monkeypatch,
        "run = len(list(pathlib.Path('.').glob('run-*'))) + 1\n"
        "pathlib.Path(f'run-{run}').touch()\n"
        "if run >= 2:\n",
    )
    opts = options(storage, "cancel", workload="program:hangs", trials=2, timeout_s=600)
    said = io.StringIO()
    with pytest.raises(Stopped, match="stopped on request"):
        run_study(opts, progress=PlainProgress(said), should_stop=(tmp_path / "run-2").exists)
    # Said as the summary counts it, not as "pruned" (a probe, 2026-12-08).
    assert "trial 0 (1/2) interrupted" in said.getvalue(), said.getvalue()
    (trial,) = load(storage, "cancel").trials
    assert trial.state.name == "PRUNED" and trial.user_attrs.get(keys.STOPPED) is True
    assert keys.FAILURE_REASON not in trial.user_attrs and keys.WINDOWS not in trial.user_attrs
    assert sum(trial.user_attrs[keys.TIME].values()) < 60  # not the program's 300 s


def test_a_cancel_stops_a_programs_gate_and_stores_no_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate's runs of a program polled no stop: a cancel in a trial's gate waited for its
    envelope's runs (each up to the program's timeout). Stopped, the trial is told as stopped,
    and no verdict is stored for its config: a stop is not the config's fault."""
    from tests.tuner.tiny import load, options
    from tuner.errors import Stopped
    from tuner.search.study import run_study
    from tuner.store import keys

    # The gate's runs are one window with no warm-up; a measurement's are not. The first of
    # them leaves a file and hangs.
    storage = _hanging_program(
        tmp_path,
        monkeypatch,
        "if (os.environ['STREAMTUNE_WARMUP'], os.environ['STREAMTUNE_WINDOWS']) == ('0', '1'):\n"
        "    pathlib.Path('gate-run').touch()\n",
    )
    opts = options(storage, "gate", workload="program:hangs", trials=2, timeout_s=600)
    started = time.perf_counter()
    with pytest.raises(Stopped, match="stopped on request"):
        run_study(opts, should_stop=(tmp_path / "gate-run").exists)
    assert time.perf_counter() - started < 120  # not the hung run's 300 s
    study = load(storage, "gate")
    (trial,) = study.trials
    assert trial.state.name == "PRUNED" and trial.user_attrs.get(keys.STOPPED) is True
    assert keys.FAILURE_REASON not in trial.user_attrs and keys.PARITY not in trial.user_attrs
    assert not [k for k in study.user_attrs if k.startswith(keys.PARITY_PREFIX)]


def _hanging_program(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str) -> str:
    """The example program registered as `program:hangs` in `tmp_path`, which sleeps 300 s
    before its start line in a run where `when` (Python lines ending in an `if ...:`, with os,
    pathlib and time imported) holds; the storage URL of a study there."""
    shutil.copy(REGISTRY.parent / "plain_loop.py", tmp_path / "plain_loop.py")
    (tmp_path / "hangs.py").write_text(
        "import os, pathlib, runpy, sys, time\n" + when + "    time.sleep(300)\n"
        "sys.argv[0] = 'plain_loop.py'\n"
        "runpy.run_path('plain_loop.py', run_name='__main__')\n"
    )
    entry = {
        "command": ["{python}", "hangs.py", "--preset", "{preset}"],
        "presets": ["tiny"],
        "settings": ["sync_interval", "pin_memory", "non_blocking", "num_workers"],
        "timeout_s": 300,
    }
    (tmp_path / "programs.json").write_text(json.dumps({"programs": {"hangs": entry}}))
    monkeypatch.setenv("TUNER_PROGRAMS", str(tmp_path / "programs.json"))
    monkeypatch.chdir(tmp_path)
    return f"sqlite:///{tmp_path / 'p.db'}"
