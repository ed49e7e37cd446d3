"""A study knows the model it measured (issue 56): running again after the model or its code
changed starts a new study, says so in one line naming how to go back to the old one, and never
mixes the two models' trials; the model as it was resumes its own study. In-process runs of
`python -m tuner run` on a real user module, a real SQLite file."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import optuna
import pytest

from tests.tuner.tiny import RUN_FLAGS, sqlite_url
from tuner.__main__ import main

MODULE = "changing_model_56"
SOURCE = """
import torch
from torch import nn
from torch.utils.data import TensorDataset

import trainers


def loss(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def build(preset, *, seed):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, WIDTH), nn.ReLU(), nn.Linear(WIDTH, 3))
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    return trainers.workload_from_parts(
        model, data, loss, optimizer=trainers.workloads.adam(1e-3), batch_size=8
    )
"""


def write(folder: Path, width: int, comment: str = "") -> None:
    (folder / f"{MODULE}.py").write_text(f"WIDTH = {width}{comment}\n{SOURCE}")
    sys.modules.pop(MODULE, None)
    importlib.invalidate_caches()


def run(capsys: pytest.CaptureFixture[str], storage: str) -> tuple[int, str]:
    flags = list(RUN_FLAGS)
    flags[flags.index("--workload") + 1] = f"{MODULE}:build"
    code = main(["run", *flags, "--trials", "1", "--storage", storage])
    return code, capsys.readouterr().err


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # each edit is read from its source
    return tmp_path


def studies_of(storage: str) -> dict[str, int]:
    return {
        s.study_name: s.n_trials
        for s in optuna.get_all_study_summaries(storage)
        if s.study_name.startswith(MODULE)
    }


def test_a_changed_model_or_code_gets_its_own_study_and_the_old_one_resumes_as_it_was(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = sqlite_url(folder)
    old = f"{MODULE}-build-tiny-cpu"
    write(folder, 16)
    code, err = run(capsys, storage)
    assert code == 0, err
    assert f"new study {old}:" in err and "changed since" not in err
    first = studies_of(storage)
    assert list(first) == [old]

    write(folder, 32)  # another architecture
    code, err = run(capsys, storage)
    assert code == 0, err
    (line,) = [x for x in err.splitlines() if "changed since" in x]
    new = line.split("new study ")[1].split(",")[0]
    assert new.startswith(f"{old}-model-") and new != old
    assert f"the model's architecture changed since study {old} was measured" in line
    assert f"to resume {old}, run again with the model and code it measured" in line
    assert f"python -m tuner best --study {old}" in line
    second = studies_of(storage)
    assert second[old] == first[old]  # nothing of the new model went into the old study

    write(folder, 16, "  # a comment: the first architecture, other code")
    code, err = run(capsys, storage)
    assert code == 0, err
    assert "the model's code changed since study" in err

    write(folder, 16)  # the model as it was: its own study, resumed
    code, err = run(capsys, storage)
    assert code == 0, err
    assert f"resuming study {old}:" in err and "changed since" not in err
    third = studies_of(storage)
    assert third[old] > first[old] and len(third) == 3
