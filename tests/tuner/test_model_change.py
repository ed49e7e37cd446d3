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


NET = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 3)

    def forward(self, x):
        return self.b(torch.ACT(self.a(x)))
"""
FACTORY = """
import torch
from torch import nn
from torch.utils.data import TensorDataset

import trainers
from net_in_its_own_file import Net


def loss(model, batch):
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


def build(preset, *, seed):
    torch.manual_seed(seed)
    data = TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    return trainers.workload_from_parts(
        Net(), data, loss, optimizer=trainers.workloads.adam(1e-3), batch_size=8
    )
"""


def test_the_identity_reads_the_models_own_class_file_and_the_files_its_arguments_name(
    folder: Path,
) -> None:
    """A user's `forward` in another file than the factory (the usual layout), and a config file
    a model argument names: a change to either had kept the digest, so the run resumed the old
    study and its verdicts (users' probes, 2026-12-06)."""
    import trainers
    from tuner.search.identity import model_identity, named_files

    (folder / "factory_of_net.py").write_text(FACTORY)
    config = folder / "my.json"
    config.write_text('{"rope_theta": 10000}')

    def identity(act: str) -> dict[str, str]:
        (folder / "net_in_its_own_file.py").write_text(NET.replace("ACT", act))
        for name in ("net_in_its_own_file", "factory_of_net"):
            sys.modules.pop(name, None)
        importlib.invalidate_caches()
        workload = trainers.load_workload("factory_of_net:build", "tiny")
        return model_identity(workload, "factory_of_net:build", {})

    relu = identity("relu")
    tanh = identity("tanh")
    assert relu["architecture"] == tanh["architecture"] and relu["code"] != tanh["code"]
    assert identity("relu") == relu  # the same files: the same digest
    # A config file's contents (a library model's `config=`), not only its path.
    before = named_files({"config": str(config), "seq": "128"})
    assert len(before) == 1 and before[0].startswith(f"config={config}:")
    config.write_text('{"rope_theta": 500000}')
    assert named_files({"config": str(config), "seq": "128"}) != before


FROM_FILE = """
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

import trainers


class Augmented(Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):  # draws from torch's global generator, as transforms do
        return self.x[i] + 0.01 * torch.randn(self.x.shape[1]), self.y[i]


def loss(model, batch):
    return nn.functional.cross_entropy(model(batch[0]), batch[1])


def build(preset, *, seed):
    x, y = torch.load(DATA)
    return trainers.workload_from_parts(
        nn.Linear(8, 3), Augmented(x, y), loss, optimizer=trainers.workloads.adam(), batch_size=8
    )
"""


def test_a_users_data_changed_in_its_file_gets_its_own_study(
    folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The factory loads its data from a file the code does not name: a changed file had
    resumed the study, and every trial failed the stored reference at step 0 with a hint about
    workers (a user's probe, 2026-12-06). An augmenting dataset keeps one digest run to run."""
    import torch

    data = folder / "data.pt"
    (folder / f"{MODULE}.py").write_text(f"DATA = {str(data)!r}\n{FROM_FILE}")
    sys.modules.pop(MODULE, None)
    importlib.invalidate_caches()
    storage, old = sqlite_url(folder), f"{MODULE}-build-tiny-cpu"
    generator = torch.Generator().manual_seed(0)
    first = (torch.randn(64, 8, generator=generator), torch.randint(0, 3, (64,)))
    torch.save(first, data)
    code, err = run(capsys, storage)
    assert code == 0, err
    code, err = run(capsys, storage)  # the same file, augmented again: the same study
    assert code == 0, err
    assert f"resuming study {old}:" in err and "changed since" not in err

    torch.save((first[0] + 1.0, first[1]), data)
    code, err = run(capsys, storage)
    assert code == 0, err
    (line,) = [x for x in err.splitlines() if "changed since" in x]
    assert (
        f"the model's data changed since study {old} was measured: new study {old}-model-" in line
    )
    assert f"to resume {old}, run again with the model and data it measured" in line
    assert "done: recommended" in err and "parity" not in err  # measured against its own data


def test_the_data_digest_reads_every_tensor_of_a_mapping_batch() -> None:
    """transformers' BatchEncoding is a UserDict, not a dict: its tensors had been read as a
    repr, which shows a few values of a large tensor and misses a change among the rest."""
    from collections import UserDict

    import torch
    from torch import nn

    import trainers
    from tuner.search.identity import data_digest

    def workload(last: int) -> trainers.Workload:
        ids = torch.zeros(4, 4096, dtype=torch.long)
        ids[2, 2000] = last  # in the middle, where a tensor's repr shows "..."
        return trainers.Workload(
            name="mapping",
            preset="tiny",
            model=nn.Linear(1, 1),
            dataset=[UserDict(input_ids=ids)],  # type: ignore[arg-type]
            loss_fn=lambda m, b: m.weight.sum(),
            samples_per_batch=4,
        )

    assert data_digest(workload(1)) == data_digest(workload(1))
    assert data_digest(workload(1)) != data_digest(workload(2))
