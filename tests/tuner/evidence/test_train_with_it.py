"""From a finished study to training with its recommendation: `tuner.load_config` from the
study (SQLite and PostgreSQL), `trainers.load_config` from the exported JSON, the recommendation
and the environment, and the script that `export --format python` prints, run as a user runs
it."""

from __future__ import annotations

import dataclasses
import io
import json
import shlex
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

import trainers
import tuner
from tests.tuner.conftest import Finished
from tests.tuner.tiny import sqlite_url
from trainers import ConfigError, LoopConfig
from tuner.errors import NoRecommendation, StudyNotFound
from tuner.evidence import export
from tuner.evidence.recommendation import Recommendation

ROOT = Path(__file__).resolve().parents[3]


def test_load_config_reads_the_studys_recommendation(finished: Finished) -> None:
    config = tuner.load_config(finished.storage, finished.study)
    assert config == LoopConfig.from_dict(finished.rec["config"])
    assert trainers.load_config(tuner.recommendation(finished.storage, finished.study)) == config


def test_load_config_reads_every_export_and_the_environment(
    finished: Finished, tmp_path: Path
) -> None:
    expected = LoopConfig.from_dict(finished.rec["config"])
    exported = tmp_path / "config.json"
    exported.write_text(export.export(finished.recommendation, "json"))
    best = tmp_path / "best.json"
    best.write_text(json.dumps(finished.rec))
    assert trainers.load_config(exported) == expected
    assert trainers.load_config(str(best)) == expected
    assert trainers.load_config(finished.rec) == expected
    env = dict(line.split("=", 1) for line in export.export(finished.recommendation, "env").split())
    assert trainers.load_config(environ=env) == expected
    # Other tools' STREAMTUNE_ variables beside them are no misspelt field.
    assert trainers.load_config(environ=env | {"STREAMTUNE_COMMIT": "abc1234"}) == expected
    assert trainers.load_config(expected) is expected


@pytest.mark.postgres
def test_load_config_reads_a_study_in_postgres(pg_url: str) -> None:
    study = optuna.create_study(storage=pg_url, study_name="tuned")
    config = LoopConfig(num_streams=3, sync_mode="query", sync_interval=7)
    study.set_user_attr("recommendation", {"study": "tuned", "config": config.to_dict()})
    assert tuner.load_config(pg_url, "tuned") == config


def test_load_config_errors_name_what_is_missing(tmp_path: Path) -> None:
    storage = sqlite_url(tmp_path)
    optuna.create_study(storage=storage, study_name="unfinished")
    with pytest.raises(StudyNotFound, match="no study named 'nope'"):
        tuner.load_config(storage, "nope")
    with pytest.raises(NoRecommendation, match="or `python -m tuner run --study unfinished` with"):
        tuner.load_config(storage, "unfinished")
    cases = [
        (dict(environ={"PATH": "/bin"}), r"^source=None is invalid: allowed a LoopConfig, a reco"),
        (dict(source=3), r"^source='int' is invalid: allowed a LoopConfig, a mapping, a recomm"),
        (  # a misspelt variable was ignored: the default trained instead
            dict(environ={"STREAMTUNE_SYNC_MODEE": "event"}),
            r"^STREAMTUNE_SYNC_MODEE='event' is invalid: allowed STREAMTUNE_SYNC_MODE, a config",
        ),
        (
            dict(environ={"STREAMTUNE_CUDA_GRAPH": "maybe"}),
            r"^STREAMTUNE_CUDA_GRAPH='maybe' is invalid: allowed true or false",
        ),
        (dict(source=tmp_path / "none.json"), r"^source='.*none.json' is invalid: allowed an exis"),
        (
            dict(source={"streams": 2}),
            r"^streams=2 is invalid: allowed a LoopConfig field \(did you mean num_streams\?\)",
        ),
        (
            dict(source={"config": None, "reason": "no config passed the gate"}),
            r"^config=None is invalid: allowed a recommended config \(the mapping has none: no ",
        ),
    ]
    for kwargs, message in cases:
        with pytest.raises(ConfigError, match=message):
            trainers.load_config(**kwargs)  # type: ignore[arg-type]
    (tmp_path / "bad.json").write_text("[1, 2]")
    with pytest.raises(ConfigError, match="allowed a JSON object"):
        trainers.load_config(tmp_path / "bad.json")


def test_the_exported_python_script_trains_the_workload_with_the_config(
    finished: Finished, tmp_path: Path
) -> None:
    # The study's seed reaches the recommendation (and so the script's SEED).
    assert finished.recommendation.study_fields["seed"] == finished.options.seed
    script = tmp_path / "train.py"
    script.write_text(export.export(finished.recommendation, "python"))
    command = [sys.executable, str(script), "--steps", "6", "--device", "cpu", "--log-every", "1"]
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=300, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    steps = [line for line in done.stdout.splitlines() if line.startswith("step ")]
    assert steps and steps[-1].startswith("step 6: loss ")
    assert "trained 6 steps in" in done.stdout
    # The script trains the study's own workload: it names it.
    assert f"WORKLOAD = {finished.rec['workload']!r}" in script.read_text()

    # And resumes from its own checkpoint.
    checkpoint = tmp_path / "run.pt"
    first = subprocess.run(
        [*command[:3], "600", *command[4:], "--checkpoint", str(checkpoint)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert first.returncode == 0, first.stderr[-2000:]
    resumed = subprocess.run(
        [*command[:3], "602", *command[4:], "--resume", str(checkpoint)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "trained 2 steps in" in resumed.stdout  # from the checkpoint written at the end
    assert resumed.stdout.splitlines()[0].startswith("step 601: loss ")


def test_the_script_says_in_one_line_that_it_cannot_import_the_workload(
    finished: Finished, tmp_path: Path
) -> None:
    """An own workload's module is imported by name: run from elsewhere, the script printed a
    traceback (a new user's trial, 2026-12-02); now one line, with where to run it from."""
    text = export.export(finished.recommendation, "python")
    named = f"WORKLOAD = {finished.rec['workload']!r}"
    assert named in text
    script = tmp_path / "train.py"
    script.write_text(text.replace(named, "WORKLOAD = 'no_such_module_of_mine:build'"))
    done = subprocess.run(
        [sys.executable, str(script), "--steps", "2", "--device", "cpu"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        timeout=300,
        check=False,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "error: workload='no_such_module_of_mine:build': cannot import"
    ), done.stderr
    assert "PYTHONPATH" in lines[0]


def test_the_script_finds_the_workloads_module_in_the_folder_it_runs_from(
    finished: Finished, tmp_path: Path
) -> None:
    """`python -m tuner` imported the module from the working folder; `python script.py` run
    there from elsewhere had not, and told the user to run from that folder, where they were (a
    probe, 2026-12-06)."""
    work, scripts = tmp_path / "work", tmp_path / "scripts"
    work.mkdir()
    scripts.mkdir()
    (work / "my_mlp_module_x.py").write_text(
        "import trainers\n"
        "def build(preset, *, seed):\n"
        "    return trainers.load_workload('mlp', preset, seed=seed)\n"
    )
    text = export.export(finished.recommendation, "python")
    named = f"WORKLOAD = {finished.rec['workload']!r}"
    (scripts / "train.py").write_text(text.replace(named, "WORKLOAD = 'my_mlp_module_x:build'"))
    done = subprocess.run(
        [sys.executable, str(scripts / "train.py"), "--steps", "2", "--device", "cpu"],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        cwd=work,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]


def test_the_script_warns_where_the_model_is_not_the_one_the_study_measured(
    finished: Finished, tmp_path: Path
) -> None:
    """A script exported from a study whose model was edited since trained the edited model
    without a word (a new user's trial): it checks the architecture the study stored."""
    text = export.export(finished.recommendation, "python")
    workload = trainers.load_workload(
        finished.rec["workload"], finished.rec["preset"], seed=finished.options.seed
    )
    measured = f"ARCHITECTURE = {trainers.architecture_digest(workload.model)!r}"
    assert measured in text
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    for architecture, warned in ((measured, False), ("ARCHITECTURE = '0badc0de'", True)):
        script = tmp_path / "train.py"
        script.write_text(text.replace(measured, architecture))
        done = subprocess.run(
            [sys.executable, str(script), "--steps", "2", "--device", "cpu"],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        assert ("is not the model the study measured" in done.stderr) is warned, done.stderr
        assert "trained 2 steps in" in done.stdout


@pytest.mark.parametrize(
    ("flags", "said"),
    [
        (["--steps", "-3"], "argument --steps: -3 is not an integer >= 1"),
        (["--steps", "0"], "argument --steps: 0 is not an integer >= 1"),
        (["--log-every", "0"], "argument --log-every: 0 is not an integer >= 1"),
        (["--steps", "ten"], "argument --steps: 'ten' is not an integer"),
        (["--device", "cuda:7"], "error: --device: "),
        # The flag named as its other errors name theirs (a probe, 2026-12-06).
        (["--device", "gpu"], "error: --device: device='gpu' is invalid"),
    ],
)
def test_the_script_refuses_a_bad_flag_in_one_line(
    finished: Finished, tmp_path: Path, flags: list[str], said: str
) -> None:
    """A new user's trial (2026-12-02): `--steps -3` ended in a traceback that spoke of "the
    steps already trained", `--log-every 0` in a ZeroDivisionError."""
    script = tmp_path / "train.py"
    script.write_text(export.export(finished.recommendation, "python"))
    done = subprocess.run(
        [sys.executable, str(script), "--device", "cpu", *flags],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": ""},
        timeout=300,
        check=False,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and said in done.stderr.strip().splitlines()[-1]


def test_the_script_carries_model_args_and_precision() -> None:
    rec = Recommendation.from_dict(
        {
            "study": "s",
            "config": LoopConfig(num_streams=2).to_dict(),
            "hardware": "NVIDIA-H100-80GB-HBM3",
            "workload": "torchvision:resnet18",
            "preset": "default",
            "model_args": {"batch": "128", "image": "32"},
            "seed": 3,
            "precision": "bf16-autocast",
        }
    )
    namespace: dict[str, object] = {}
    exec(compile(export.export(rec, "python"), "<export>", "exec"), namespace)
    assert namespace["WORKLOAD"] == "torchvision:resnet18"
    assert namespace["MODEL_ARGS"] == {"batch": "128", "image": "32"}
    # The study's seed: the exported script had trained seed 0's weights and data whatever
    # seed the study was tuned with (a new user's trial, 2026-12-02).
    assert namespace["SEED"] == 3
    assert namespace["PRECISION"] == "bf16-autocast"
    assert namespace["config"] == LoopConfig(num_streams=2)


def test_the_scripts_documented_resume_gives_the_uninterrupted_losses(
    finished: Finished, tmp_path: Path
) -> None:
    """The commands the script's header and the README give: `--steps` is the total, a
    `{step}` in `--checkpoint` keeps every checkpoint, and a run resumed from step 500 prints the
    uninterrupted run's losses from there on; a checkpoint that reached `--steps` is one line."""
    script = tmp_path / "train.py"
    script.write_text(export.export(finished.recommendation, "python"))
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}

    def train(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(script), "--device", "cpu", *args],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
            timeout=300,
            check=False,
        )

    def losses(out: str) -> dict[int, str]:
        found = [line.split(": loss ") for line in out.splitlines() if line.startswith("step ")]
        return {int(step.removeprefix("step ")): loss for step, loss in found}

    whole = train("--steps", "1000", "--checkpoint", "run-{step}.pt")
    assert whole.returncode == 0, whole.stderr[-2000:]
    assert (tmp_path / "run-500.pt").is_file() and (tmp_path / "run-1000.pt").is_file()
    resumed = train("--steps", "1000", "--resume", "run-500.pt")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "trained 500 steps in" in resumed.stdout
    again = losses(resumed.stdout)
    assert sorted(again) == list(range(600, 1001, 100))
    assert again == {step: loss for step, loss in losses(whole.stdout).items() if step > 500}

    # An empty --resume is said, not taken as none (it had trained from step 0 in silence).
    empty = train("--steps", "1000", "--resume", "")
    assert empty.returncode == 2 and empty.stderr.strip() == (
        "error: --resume: path='' is invalid: allowed a checkpoint file's path"
    ), empty.stderr[-2000:]
    done = train("--steps", "1000", "--resume", "run-1000.pt")
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    assert "has trained 1000 steps" in line and "--steps 2000" in line
    more = train("--steps", "1100", "--resume", "run-1000.pt", "--checkpoint", "run.pt")
    assert more.returncode == 0, more.stderr[-2000:]
    assert "trained 100 steps in" in more.stdout
    assert (tmp_path / "run.pt").is_file()  # written at the end (1100 is no multiple of 500)


def test_the_summary_gives_a_long_studys_export_command_on_one_line(finished: Finished) -> None:
    """A library model's study name runs to 200 characters; in the table's 80-column cell
    (stdout not a terminal) the command wrapped and could not be copied (2026-12-02)."""
    from rich.console import Console

    from tuner.evidence import render

    long = dataclasses.replace(finished.recommendation, study="timm-resnet10t-tiny-" + "x" * 150)
    # A name a user gave with a space in it is quoted, so the command still pastes as one.
    spaced = dataclasses.replace(finished.recommendation, study="my run/a b")
    for rec in (long, finished.recommendation, spaced):
        out = io.StringIO()
        render.recommendation(Console(file=out, width=80), rec)
        command = f"python -m tuner export --study {shlex.quote(rec.study)} --format python"
        assert command in out.getvalue().splitlines() or f"  {command}" in out.getvalue()
    print(out.getvalue())
    assert "--study 'my run/a b' --format" in out.getvalue()


def test_a_data_parallel_recommendation_trains_under_torchrun_and_says_how_outside_it(
    tmp_path: Path,
) -> None:
    """A two-process study's DDP pick: its script had refused "parallel='ddp' ... outside a
    torchrun launch" under `python` and under torchrun alike, which never started the process
    group (a user's probe, 2026-12-05). Two gloo processes on the CPU, as CI has."""
    rec = Recommendation.from_dict(
        {
            "study": "s",
            "config": LoopConfig(parallel="ddp", num_workers=0).to_dict(),
            "hardware": "cpu-x2",
            "workload": "mlp",
            "preset": "tiny",
            "nproc_per_node": 2,
        }
    )
    text = export.export(rec, "python")
    assert "# Trains mlp tiny (seed 0) with it: torchrun --nproc-per-node 2 this_file.py" in text
    script = tmp_path / "train.py"
    script.write_text(text)
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    flags = ["--steps", "4", "--device", "cpu", "--log-every", "2"]

    def run(*command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, str(script), *flags],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            check=False,
        )

    alone = run(sys.executable)
    assert alone.returncode == 2
    assert alone.stderr.strip().endswith(
        f"launch it as torchrun --nproc-per-node 2 {script} [its flags]"
    ), alone.stderr
    ranks = run(
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"
    )
    assert ranks.returncode == 0, ranks.stderr[-2000:]
    # Rank 0 alone prints: each line once.
    assert [
        line.split(":")[0] for line in ranks.stdout.splitlines() if line.startswith("step")
    ] == [
        "step 2",
        "step 4",
    ]
    assert ranks.stdout.count("trained 4 steps in") == 1
    # Rank 0 writes the checkpoint (the replicas are equal); every rank resumes from it.
    checkpoint = tmp_path / "run.pt"
    launch = (
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
    )
    flags += ["--checkpoint", str(checkpoint)]
    assert run(*launch).returncode == 0 and checkpoint.exists()
    flags[1], flags[-2:] = "6", ["--resume", str(checkpoint)]
    resumed = run(*launch)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert resumed.stdout.count("trained 2 steps in") == 1


def test_an_fsdp2_scripts_header_does_not_offer_the_checkpoints_it_refuses() -> None:
    """The FSDP2 script's header showed `--checkpoint` and `--resume` lines, and its
    `--checkpoint` then refused: "not with parallel=fsdp2" (a probe, 2026-12-06)."""
    base = {"study": "s", "hardware": "cpu-x2", "workload": "mlp", "preset": "tiny"}
    for parallel, offered in (("fsdp2", False), ("ddp", True)):
        config = LoopConfig(parallel=parallel, num_workers=0).to_dict()  # type: ignore[arg-type]
        text = export.export(Recommendation.from_dict(base | {"config": config}), "python")
        header = text.split("from __future__")[0]
        assert ("--checkpoint 'run-{step}.pt'" in header) == offered, header
        assert ("No --checkpoint or --resume here" in header) != offered, header
        compile(text, "<export>", "exec")
