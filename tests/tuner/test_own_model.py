"""Your own model as the README states it (issue 56): the README's example is the file the
tests run, the call it shows binds to the code's signature, and each way a new user gets the
contract wrong (a factory of another signature, a criterion as the loss, samples without a batch
size) is one line naming the field and the file and line to fix. Real torch, real runs."""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

import trainers
from tuner.__main__ import main

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_shows_the_example_file_whole() -> None:
    shown = re.findall(r"<!-- file: (\S+) -->\n```python\n(.*?)```", README, re.S)
    assert [path for path, _ in shown] == ["examples/my_model.py"]
    assert shown[0][1] == (ROOT / "examples/my_model.py").read_text(encoding="utf-8")
    assert len(shown[0][1].splitlines()) <= 25


def test_the_call_the_readme_names_binds_to_workload_from_parts() -> None:
    calls = re.findall(r"trainers\.workload_from_parts\(([^)]*)\)", " ".join(README.split()))
    assert len(calls) == 2  # the prose's and the example's
    for call in calls:
        positional = [a.strip() for a in call.split(",") if "=" not in a]
        keywords = {a.split("=")[0].strip(): None for a in call.split(",") if "=" in a}
        inspect.signature(trainers.workload_from_parts).bind(*positional, **keywords)
        assert "batch_size" in keywords
    assert "`loss_fn(model, batch)`" in README


@pytest.mark.slow
def test_the_readme_own_model_block_runs_as_written(tmp_path: Path) -> None:
    (block,) = [
        body
        for body in re.findall(r"<!-- test: cpu -->\n```bash\n(.*?)```", README, re.S)
        if "examples.my_model" in body
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("TUNER_")}
    env["PYTHONPATH"] = str(ROOT)  # the clone, as a user runs it from there
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"
    done = subprocess.run(
        ["bash", "-e", "-c", block], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "recommended" in done.stdout and "0 failed" in " ".join(done.stdout.split())


def write_factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: str) -> Path:
    path = tmp_path / "user_model_56.py"
    path.write_text(
        "import torch\nfrom torch import nn\nfrom torch.utils.data import TensorDataset\n"
        "import trainers\n\n" + body
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("user_model_56", None)
    return path


def run_error(capsys: pytest.CaptureFixture[str]) -> str:
    code = main(
        [
            *("run", "--workload", "user_model_56:build", "--preset", "tiny", "--trials", "1"),
            *("--storage", "sqlite://", "--quiet"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1, err
    return err


def test_a_factory_of_another_signature_names_its_file_and_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_factory(tmp_path, monkeypatch, "def build(preset):\n    return None\n")
    err = run_error(capsys)
    assert "must be callable as factory(preset, *, seed)" in err
    assert err.rstrip().endswith(f"({path}:6)"), err


DATA = "data = TensorDataset(torch.randn(64, 4), torch.randint(0, 3, (64,)))\n"
OPT = (
    "def adam(params, capturable):\n    return torch.optim.Adam(params, capturable=capturable)\n\n"
)


def test_a_criterion_given_as_the_loss_is_one_line_naming_loss_fn_and_the_users_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_factory(
        tmp_path,
        monkeypatch,
        OPT
        + "def build(preset, *, seed):\n    "
        + DATA
        + "    return trainers.workload_from_parts("
        "nn.Linear(4, 3), data, nn.CrossEntropyLoss(), optimizer=adam, batch_size=8)\n",
    )
    err = run_error(capsys)
    assert "loss_fn=" in err and "a function loss_fn(model, batch)" in err
    assert err.rstrip().endswith(f"({path}:11)"), err


def test_samples_without_a_batch_size_is_one_line_naming_batch_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_factory(
        tmp_path,
        monkeypatch,
        OPT + "def loss(model, batch):\n    return model(batch[0]).sum()\n\n"
        "def build(preset, *, seed):\n    " + DATA + "    return trainers.workload_from_parts("
        "nn.Linear(4, 3), data, loss, optimizer=adam)\n",
    )
    err = run_error(capsys)
    assert "batch_size=None is invalid: allowed an integer for a Dataset of samples" in err
    assert err.rstrip().endswith(f"({path}:14)"), err


def test_a_loss_that_is_nan_whatever_the_settings_stops_the_job_before_its_trials(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each trial's gate had blamed reproducibility (NaN differs from NaN), a second check failed
    on the stored envelope ("float() argument ... 'NoneType'"), and the job ended in "no config
    passed parity (and the memory cap)" with no cap set (a new user's trial, 2026-12-02)."""
    storage = f"sqlite:///{tmp_path / 'nan.db'}"
    code = main(
        [
            *("run", "--workload", "tests.trainers.own_workloads:nan_loss", "--preset", "tiny"),
            *("--trials", "3", "--storage", storage, "--quiet"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1, err
    assert err.startswith(
        "error: --workload: the PyTorch default loop's loss is not finite at its step 0"
    ), err
    # Stopped before any trial, and the study it made is gone: it had stayed, empty, and a run
    # of the fixed workload with another seed was refused as "made with seed=0" (a user's probe).
    assert optuna.get_all_study_summaries(storage) == []
    again = ["run", "--workload", "tests.trainers.own_workloads:nan_loss", "--preset", "tiny"]
    assert main([*again, "--seed", "1", "--trials", "3", "--storage", storage, "--quiet"]) == 2
    assert "made with seed" not in capsys.readouterr().err


def _refused_run(tmp_path: Path, capsys: pytest.CaptureFixture[str], factory: str) -> str:
    """The one error line of a 3-trial run of `own_workloads:factory` that stops with exit 2
    before its trials, its study gone."""
    storage = f"sqlite:///{tmp_path / 'refused.db'}"
    workload = f"tests.trainers.own_workloads:{factory}"
    args = ("run", "--workload", workload, "--preset", "tiny", "--trials", "3", "--quiet")
    code = main([*args, "--storage", storage])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert optuna.get_all_study_summaries(storage) == []
    return err


def test_a_loss_that_fails_in_the_users_code_stops_the_job_before_its_trials(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The PyTorch default loop raised in the user's loss; each trial then failed the same way."""
    err = _refused_run(tmp_path, capsys, "fails_in_its_loss")
    assert err.startswith("error: --workload: the PyTorch default loop failed (ValueError at "), err
    assert "own_workloads.py:" in err and "this loss refuses every batch" in err, err


def test_float64_features_for_a_float32_model_are_named_with_their_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _refused_run(tmp_path, capsys, "float64_features")
    assert "the PyTorch default loop failed (RuntimeError: mat1 and mat2 " in err, err
    assert "torch.from_numpy give float64; .float() the batch's floating tensors" in err, err
