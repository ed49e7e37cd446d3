"""A Trainer's checkpoint arguments and resumes refused whole, before any step or any change:
the cases a user's probe (2026-12-06) found failing late, silently or with the wrong cause."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import torch
from torch.optim.lr_scheduler import OneCycleLR, StepLR

import trainers
from tests.trainers.test_fit import _sgd_workload
from trainers import ConfigError, Trainer


def sgd_workload(width: int = 16) -> trainers.Workload:
    """test_fit's workload, its SGD with momentum (a checkpoint with optimizer state to restore)."""
    return _sgd_workload(width, functools.partial(torch.optim.SGD, momentum=0.9))


def weights(trainer: Trainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.model.parameters()]


def test_checkpoint_paths_are_checked_and_filled_before_any_step(tmp_path: Path) -> None:
    """A folder raised IsADirectoryError at the first checkpoint, the steps trained lost;
    `{step:04d}` was kept as written, every checkpoint overwriting one file."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "file.pt").write_bytes(b"")
    bad = {
        # A file among its folders: a raw FileExistsError at the first checkpoint (a probe).
        str(tmp_path / "file.pt" / "deeper" / "run-{step}.pt"): r"a file path in a folder this "
        r"process can write \('.*file\.pt' is a file\)$",
        str(tmp_path / "folder"): "not a folder",
        "": "not a folder",
        ".": "not a folder",
        str(tmp_path / "run-{epoch}.pt"): r"whose only placeholder is \{step\}",
        str(tmp_path / "run-{step:q}.pt"): r"whose only placeholder is \{step\} \(",
    }
    for path, allowed in bad.items():
        trainer = Trainer(sgd_workload(), device="cpu")
        with pytest.raises(
            ConfigError, match=rf"^checkpoint_path=.* is invalid: allowed .*{allowed}"
        ):
            trainer.fit(6, checkpoint_every=3, checkpoint_path=path)
        assert trainer.step == 0
    trainer = Trainer(sgd_workload(), device="cpu")
    done = trainer.fit(6, checkpoint_every=3, checkpoint_path=tmp_path / "run-{step:04d}.pt")
    assert [Path(p).name for p in done.checkpoints] == ["run-0003.pt", "run-0006.pt"]
    assert trainers.checkpoint_file("run-{{x}}-{step}.pt", 7) == Path("run-{x}-7.pt")
    # `save` fills it in as `fit` does: it had written a file named run-{step}.pt.
    assert trainer.save(tmp_path / "saved-{step}.pt") == tmp_path / "saved-6.pt"
    assert torch.load(tmp_path / "saved-6.pt", weights_only=True)["step"] == 6
    with pytest.raises(ConfigError, match=r"^path=.* is invalid: .*file\.pt' is a file\)$"):
        trainer.save(tmp_path / "file.pt" / "saved.pt")
    assert (tmp_path / "file.pt").read_bytes() == b""


def test_callbacks_that_are_not_callable_are_refused_before_any_step() -> None:
    trainer = Trainer(
        sgd_workload(), device="cpu", eval_data=[(torch.randn(8, 6), torch.randn(8, 1))]
    )
    with pytest.raises(ConfigError, match=r"^on_losses=3 is invalid: allowed a callable, or None"):
        trainer.fit(4, on_losses=3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"^on_eval='x' is invalid: allowed a callable"):
        trainer.fit(4, eval_every=2, on_eval="x")  # type: ignore[arg-type]
    assert trainer.step == 0


def test_a_refused_resume_leaves_the_trainer_as_it_was(tmp_path: Path) -> None:
    """fit(resume_from=...) had loaded the checkpoint before checking `steps`: refused, the
    Trainer was back at the checkpoint's step with its weights, 15 trained steps gone."""
    trainer = Trainer(sgd_workload(), device="cpu")
    trainer.fit(10, checkpoint_every=5, checkpoint_path=tmp_path / "m-{step}.pt")
    trainer.fit(20)
    before = weights(trainer)
    with pytest.raises(ConfigError, match=r"^steps=4 is invalid: allowed an integer > 5 \(the"):
        trainer.fit(4, resume_from=tmp_path / "m-5.pt")
    assert trainer.step == 20
    assert all(torch.equal(a, b) for a, b in zip(before, weights(trainer), strict=True))
    assert trainer.fit(8, resume_from=tmp_path / "m-5.pt").start_step == 5


def test_a_checkpoint_of_another_kind_is_refused_for_what_differs(tmp_path: Path) -> None:
    """Another model's checkpoint under another config had been refused for its config; another
    scheduler kind as another optimizer; a list saved with torch.save raised AttributeError."""
    path = tmp_path / "c.pt"
    Trainer(sgd_workload(), device="cpu").fit(4, checkpoint_every=4, checkpoint_path=path)
    other = Trainer(sgd_workload(width=32), trainers.LoopConfig(sync_interval=3), device="cpu")
    refused = r"^path='.*c.pt' is invalid: .*differ \(the checkpoint is"
    with pytest.raises(ConfigError, match=refused):  # `load` names its own argument
        other.load(path)
    scheduled = tmp_path / "s.pt"
    Trainer(sgd_workload(), device="cpu", scheduler=lambda o: StepLR(o, 4, 0.5)).fit(
        4, checkpoint_every=4, checkpoint_path=scheduled
    )
    cycling = Trainer(
        sgd_workload(), device="cpu", scheduler=lambda o: OneCycleLR(o, 1.0, total_steps=30)
    )
    with pytest.raises(ConfigError, match=r"^scheduler='OneCycleLR' is invalid: allowed StepLR"):
        cycling.load(scheduled)
    for name, saved in (("list", [1, 2]), ("Tensor", torch.zeros(3))):
        torch.save(saved, tmp_path / f"{name}.pt")
        refused = rf"^resume_from='.*{name}.pt' is invalid: .*: this is not one \(a {name}\)$"
        with pytest.raises(ConfigError, match=refused):
            Trainer(sgd_workload(), device="cpu").fit(6, resume_from=tmp_path / f"{name}.pt")
        with pytest.raises(ConfigError, match=rf"^path='.*{name}.pt' is invalid: "):
            Trainer(sgd_workload(), device="cpu").load(tmp_path / f"{name}.pt")
    # A model's bare state dict: a ConfigError as every other refused file (a TrainerError
    # had slipped past code catching ConfigError, a user's probe, 2026-12-07).
    torch.save({"model": sgd_workload().model.state_dict()}, tmp_path / "bare.pt")
    with pytest.raises(ConfigError, match=r"this is not one \(format None\)$"):
        Trainer(sgd_workload(), device="cpu").load(tmp_path / "bare.pt")


def test_held_out_batches_the_loss_cannot_take_are_refused_before_any_step() -> None:
    """Other features, a missing key, a wrong label type: each had trained to the first
    evaluation, then raised there as a traceback (a probe, 2026-12-06: 250 steps in)."""
    bad = {
        "other sizes": [(torch.randn(8, 5), torch.randn(8, 1))],
        "a missing item": [(torch.randn(8, 6),)],
    }
    for why, eval_data in bad.items():
        with pytest.raises(ConfigError) as info:
            Trainer(sgd_workload(), device="cpu", eval_data=eval_data)
        assert str(info.value).startswith(
            "eval_data='its first batch' is invalid: allowed batches the loss takes "
            "(loss_fn(model, batch) on it raised "
        ), (why, info.value)
    # Its own loss (`eval_loss`) on dict batches: a key it reads is missing.
    with pytest.raises(ConfigError, match=r"raised KeyError at .*: 'y'\)$"):
        Trainer(
            sgd_workload(),
            device="cpu",
            eval_data=[{"x": torch.randn(8, 6)}],
            eval_loss=lambda m, b: torch.nn.functional.mse_loss(m(b["x"]), b["y"]),
        )
    # Good batches build, and the check read none of them for good.
    good = [(torch.randn(8, 6), torch.randn(8, 1))]
    assert Trainer(sgd_workload(), device="cpu", eval_data=good).evaluate() > 0


def _adam_mlp(frozen: int | None, kind: type = torch.optim.AdamW) -> trainers.Workload:
    """A two-layer classifier whose optimizer (`kind`) steps the parameters left trainable
    (layer `frozen` frozen, or none)."""
    torch.manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))
    if frozen is not None:
        model[frozen].requires_grad_(False)
    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    return trainers.workload_from_parts(
        model,
        data,
        lambda m, b: torch.nn.functional.cross_entropy(m(b[0]), b[1]),
        optimizer=lambda params, capturable: kind([p for p in params if p.requires_grad], lr=1e-2),
        batch_size=8,
    )


@pytest.mark.parametrize(
    ("frozen", "refusal"),
    [
        (None, r"optimizer's 4 parameters \(by group: \[4\];.*the file has an optimizer of 2 "),
        (2, r"parameter 0 is shaped \[16, 8\];.*the file has optimizer state 'exp_avg' of "),
    ],
    ids=["unfrozen", "other-layer-frozen"],
)
def test_a_resume_whose_optimizer_steps_other_parameters_is_refused_before_any_change(
    frozen: int | None, refusal: str, tmp_path: Path
) -> None:
    """A checkpoint with layer 0 frozen resumed with nothing frozen had loaded the weights, then
    raised torch's ValueError from the optimizer's load; with layer 2 frozen instead (as many
    parameters) it restored, then failed at the first step at step 4 (a user's probe,
    2026-12-06)."""
    Trainer(_adam_mlp(0), device="cpu").fit(
        4, checkpoint_every=4, checkpoint_path=tmp_path / "a.pt"
    )
    trainer = Trainer(_adam_mlp(frozen), device="cpu")
    before = weights(trainer)
    with pytest.raises(ConfigError, match=rf"^resume_from=.* is invalid: allowed .*{refusal}"):
        trainer.fit(6, resume_from=tmp_path / "a.pt")
    assert trainer.step == 0
    assert all(torch.equal(a, b) for a, b in zip(before, weights(trainer), strict=True))
    # The same freezing resumes; so does Adafactor's factored state ([16, 1] and [1, 8] for a
    # [16, 8] weight), shaped apart from its parameters.
    assert Trainer(_adam_mlp(0), device="cpu").fit(6, resume_from=tmp_path / "a.pt").step == 6
    factored = Trainer(_adam_mlp(0, torch.optim.Adafactor), device="cpu")
    factored.fit(4, checkpoint_every=4, checkpoint_path=tmp_path / "f.pt")
    resumed = Trainer(_adam_mlp(0, torch.optim.Adafactor), device="cpu")
    assert resumed.fit(6, resume_from=tmp_path / "f.pt").step == 6


def test_a_resume_under_another_precision_or_clipping_is_refused(tmp_path: Path) -> None:
    """A bf16-autocast checkpoint had resumed into an fp32 Trainer without a word (a GradScaler's
    state would be dropped so), and one of clip_grad_norm=1 into a Trainer without clipping (a
    user's probe, 2026-12-06); the checkpoint records both now."""
    Trainer(sgd_workload(), device="cpu", precision="bf16-autocast", clip_grad_norm=1.0).fit(
        4, checkpoint_every=4, checkpoint_path=tmp_path / "c.pt"
    )
    for options, refusal in (
        ({"clip_grad_norm": 1.0}, r"^precision='fp32' is invalid: allowed 'bf16-autocast', as"),
        ({"precision": "bf16-autocast"}, r"^clip_grad_norm=None is invalid: allowed 1.0, as in"),
        (
            {"precision": "bf16-autocast", "clip_grad_norm": 2.0},
            r"^clip_grad_norm=2.0 is invalid: allowed 1.0, as in the checkpointed run$",
        ),
    ):
        trainer = Trainer(sgd_workload(), device="cpu", **options)  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match=refusal):
            trainer.fit(6, resume_from=tmp_path / "c.pt")
        assert trainer.step == 0
    same = Trainer(sgd_workload(), device="cpu", precision="bf16-autocast", clip_grad_norm=1.0)
    assert same.fit(6, resume_from=tmp_path / "c.pt").step == 6
