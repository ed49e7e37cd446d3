"""The memory-for-compute levers through the loop core on a CPU: micro-batches accumulate the
whole batch's gradients, checkpointing changes no bit, the blocks are put back after a run, the
model FLOPs are reported, and `Trainer.fit` gets the levers too."""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter

import trainers
from trainers import LoopConfig, RunArgs, Trainer, load_workload
from trainers.blocks import find_blocks
from trainers.recompute import apply_block_levers
from trainers.workloads import SyntheticBatches, adam
from trainers.workloads.base import disable_dropout

FEED = {"sync_interval": 3}


def _losses(name: str, config: LoopConfig, *, dropout: bool = False, steps: int = 6) -> list[float]:
    workload = load_workload(name, "tiny", seed=0)
    if not dropout:
        disable_dropout(workload.model)
    result = trainers.run(
        workload, config, trainers.RunArgs(steps=steps, warmup=0, windows=1, device="cpu")
    )
    return result.losses


@pytest.mark.parametrize("pieces", [2, 4, 8])
def test_micro_batches_train_as_the_whole_batch(pieces: int) -> None:
    whole = _losses("mlp", LoopConfig(**FEED))
    split = _losses("mlp", LoopConfig(micro_batches=pieces, **FEED))
    # The same batch, the same optimizer steps: only the order of the gradient sums differs.
    assert split == pytest.approx(whole, rel=1e-5, abs=1e-6)


def _grads(
    workload: trainers.Workload, batch: tuple[torch.Tensor, ...], pieces: int
) -> list[torch.Tensor]:
    model = workload.model
    model.zero_grad(set_to_none=True)
    parts = trainers.split_batch(batch, pieces) if pieces > 1 else [batch]
    for part in parts:
        (workload.loss_fn(model, part) / len(parts)).backward()
    return [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("pieces", [2, 4])
def test_micro_batch_gradients_equal_the_whole_batch_gradients(pieces: int) -> None:
    workload = load_workload("transformer", "tiny", seed=0)
    disable_dropout(workload.model)
    src, _, _ = workload.dataset[0]
    # Every sequence at full length: each micro-batch's mean loss is over as many tokens as
    # another's, so the mean of their means is the whole batch's mean.
    full = torch.where(src == 0, 5, src)
    tgt_out = full.flip(-1)
    tgt_in = torch.cat([torch.full_like(full[:, :1], 1), tgt_out[:, :-1]], dim=-1)
    batch = (full, tgt_in, tgt_out)
    for a, b in zip(_grads(workload, batch, 1), _grads(workload, batch, pieces), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_with_padding_micro_batches_weigh_samples_not_tokens() -> None:
    # transformer's reverse task pads its sequences and its loss is the mean over real tokens:
    # a micro-batch of fewer real tokens weighs as much as one of more. Documented, and left to
    # the gate's equivalence test (LoopConfig.micro_batches, trainers.gate.parity).
    workload = load_workload("transformer", "tiny", seed=0)
    disable_dropout(workload.model)
    batch = tuple(workload.dataset[0])
    whole, split = _grads(workload, batch, 1), _grads(workload, batch, 2)
    pairs = zip(whole, split, strict=True)
    assert any(not torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in pairs)


def test_a_batch_that_does_not_split_is_refused_naming_micro_batches() -> None:
    workload = load_workload("mlp", "tiny", seed=0)  # 16 samples a batch
    workload.dataset = torch.utils.data.TensorDataset(  # type: ignore[assignment]
        torch.randn(4, 6, 32), torch.randint(0, 10, (4, 6))
    )
    with pytest.raises(trainers.ConfigError, match=r"micro_batches.*divisor of the batch"):
        trainers.run(
            workload,
            LoopConfig(micro_batches=4),
            trainers.RunArgs(steps=1, warmup=0, windows=1, device="cpu"),
        )


@pytest.mark.parametrize(
    ("mode", "share"), [("blocks", 1.0), ("blocks", 0.5), ("selective", 1.0), ("selective", 0.25)]
)
def test_checkpointing_changes_no_bit_of_the_losses(mode: str, share: float) -> None:
    # Dropout on: the recompute replays the forward's random numbers (the checkpoint keeps the
    # random-number state), so even the masks match.
    plain = _losses("transformer", LoopConfig(**FEED), dropout=True)
    checkpointed = _losses(
        "transformer",
        LoopConfig(activation_checkpointing=mode, checkpoint_share=share, **FEED),  # type: ignore[arg-type]
        dropout=True,
    )
    assert checkpointed == plain


def test_a_run_puts_the_blocks_back() -> None:
    workload = load_workload("transformer", "tiny", seed=0)
    blocks = find_blocks(workload.model)
    config = LoopConfig(activation_checkpointing="selective")
    trainers.run(workload, config, trainers.RunArgs(steps=2, warmup=0, windows=1, device="cpu"))
    assert all("forward" not in vars(block) for block in blocks)


def test_a_lever_without_blocks_is_refused_and_leaves_the_model_alone() -> None:
    workload = load_workload("mlp", "tiny", seed=0)
    with pytest.raises(trainers.ConfigError, match="activation_checkpointing"):
        trainers.run(
            workload,
            LoopConfig(activation_checkpointing="blocks"),
            trainers.RunArgs(steps=1, warmup=0, windows=1, device="cpu"),
        )


def test_the_run_reports_its_model_flops_and_no_mfu_on_a_cpu() -> None:
    workload = load_workload("mlp", "tiny", seed=0)
    result = trainers.run(
        workload, LoopConfig(), trainers.RunArgs(steps=2, warmup=0, windows=1, device="cpu")
    )
    assert result.flops_per_step is not None and result.flops_per_step > 0
    out = result.to_dict()
    assert out["mfu"] is None and "CPU" in out["mfu_note"]
    assert out["tflops"] > 0


def test_checkpointing_does_not_count_its_recompute_as_model_flops() -> None:
    def flops(config: LoopConfig) -> int | None:
        workload = load_workload("transformer", "tiny", seed=0)
        return trainers.run(
            workload, config, trainers.RunArgs(steps=1, warmup=0, windows=1, device="cpu")
        ).flops_per_step

    assert flops(LoopConfig(activation_checkpointing="blocks")) == flops(LoopConfig())


def test_the_trainer_trains_with_the_levers_as_run_measures_them() -> None:
    config = LoopConfig(micro_batches=2, activation_checkpointing="blocks", **FEED)
    measured = _losses("transformer", config, steps=6)
    workload = load_workload("transformer", "tiny", seed=0)
    disable_dropout(workload.model)
    fitted = Trainer(workload, config, device="cpu").fit(6)
    assert fitted.losses == measured


@pytest.mark.slow
def test_each_block_compiled_on_its_own_trains_the_same_model() -> None:
    torch._dynamo.reset()
    workload = load_workload("transformer", "tiny", seed=0)
    disable_dropout(workload.model)
    blocks = find_blocks(workload.model)
    config = LoopConfig(compile="default", compile_scope="blocks", **FEED)
    result = trainers.run(
        workload, config, trainers.RunArgs(steps=6, warmup=1, windows=1, device="cpu")
    )
    eager = _losses("transformer", LoopConfig(**FEED), steps=7)
    # Inductor fuses other kernels than eager runs: close, not equal.
    assert result.losses == pytest.approx(eager, rel=1e-3)
    assert all(getattr(b, "_compiled_call_impl", None) is None for b in blocks)


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(8, 8)
        self.b = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.b(torch.tanh(self.a(x)))


class _FitsOnlyCheckpointed(torch.nn.Module):
    """A model 'too large' for its device unless its blocks are checkpointed: its forward raises
    the error CUDA raises (a CPU build has the class too) while training un-checkpointed."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block() for _ in range(3))
        self.head = torch.nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wrapped = all("forward" in vars(block) for block in self.blocks)
        if torch.is_grad_enabled() and not wrapped:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def _too_large(preset: str, *, seed: int) -> trainers.Workload:
    from trainers.workloads import SyntheticBatches, adam
    from trainers.workloads.mlp import classification_loss

    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(4, 6, 8, generator=generator)
    return trainers.Workload(
        name="too_large",
        preset=preset,
        model=_FitsOnlyCheckpointed(),
        dataset=SyntheticBatches((x, torch.randint(0, 3, (4, 6), generator=generator))),
        loss_fn=classification_loss,
        samples_per_batch=6,
        make_optimizer=adam(1e-2),
    )


def test_a_gate_reference_that_does_not_fit_runs_checkpointed_with_the_same_losses() -> None:
    from trainers.gate import trajectory

    with pytest.raises(torch.cuda.OutOfMemoryError):
        trainers.run(
            _too_large("x", seed=0), LoopConfig(), trainers.RunArgs(steps=2, warmup=0, windows=1)
        )
    reference = trajectory(
        _too_large, "x", trainers.REFERENCE, RunArgs(steps=6, device="cpu")
    ).losses
    checkpointed = LoopConfig(activation_checkpointing="blocks")
    assert (
        reference
        == trajectory(_too_large, "x", checkpointed, RunArgs(steps=6, device="cpu")).losses
    )
    assert len(reference) == 6


def test_a_gate_reference_without_blocks_that_does_not_fit_runs_split() -> None:
    """No blocks to checkpoint: the reference runs in micro-batches, the split a config of the
    same micro-batches takes, so the two give the same losses."""
    from tests.tuner.workloads_for_tests import needs_micro_batches
    from trainers.gate import trajectory

    with pytest.raises(torch.cuda.OutOfMemoryError):
        trainers.run(
            needs_micro_batches("x", seed=0),
            LoopConfig(),
            trainers.RunArgs(steps=2, warmup=0, windows=1),
        )
    reference = trajectory(
        needs_micro_batches, "x", trainers.REFERENCE, RunArgs(steps=6, device="cpu")
    )
    split = trainers.REFERENCE.replace(micro_batches=2)
    assert (
        reference.losses
        == trajectory(needs_micro_batches, "x", split, RunArgs(steps=6, device="cpu")).losses
    )
    assert len(reference.losses) == 6


def test_a_plain_step_that_did_not_fit_is_not_tried_again_in_the_process() -> None:
    """Each attempt of a plain step that does not fit fills the device first; the gate runs the
    reference up to seven times a check. After the first, the stand-in runs straight away, with
    the same losses."""
    from trainers.gate import trajectories

    attempts: list[bool] = []

    def counted(preset: str, *, seed: int) -> trainers.Workload:
        built = _too_large(preset, seed=seed)
        forward = built.model.forward

        def forward_counted(x: torch.Tensor) -> torch.Tensor:
            if torch.is_grad_enabled():  # a training forward, plain or checkpointed
                attempts.append(all("forward" in vars(b) for b in built.model.blocks))
            return forward(x)

        built.model.forward = forward_counted  # type: ignore[method-assign]
        return built

    trajectories._PLAIN_DOES_NOT_FIT.clear()
    first = trajectories.trajectory(
        counted, "y", trainers.REFERENCE, RunArgs(steps=3, device="cpu")
    )
    plain_first = attempts.count(False)  # the plain run (and the FLOP counts of each run)
    assert plain_first >= 1 and attempts[-1] is True  # then checkpointed
    attempts.clear()
    again = trajectories.trajectory(
        counted, "y", trainers.REFERENCE, RunArgs(steps=3, device="cpu")
    )
    assert attempts.count(False) < plain_first and attempts[-1] is True
    assert again.losses == first.losses
    # Another shape (preset) is tried plain first.
    attempts.clear()
    trajectories.trajectory(counted, "z", trainers.REFERENCE, RunArgs(steps=3, device="cpu"))
    assert attempts.count(False) == plain_first


class _CalledBlock(_Block):
    """A block with a `__call__` of its own, as Hugging Face's decoder layers have
    (`GradientCheckpointingLayer`): Dynamo traces into `nn.Module.__call__` there and guards
    what it reads on the instance, `_compiled_call_impl` among it."""

    def __call__(self, *args: torch.Tensor) -> torch.Tensor:
        return super().__call__(*args)


class _Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(_CalledBlock() for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_blocks_compiled_on_their_own_and_put_back_run_a_fresh_models_compiled_code() -> None:
    # The search runs a per-block trial on its model, later a whole-model trial on the same
    # model, and the gate runs that trial's kept code on a fresh model: a block left unlike a
    # fresh one's failed Dynamo's guards there (2026-12-02, H200: the leader compiled again,
    # 22 s, and the final round dropped its kept code and compiled both finalists again).
    torch._dynamo.reset()
    used, fresh = _Stack(), _Stack()
    workload = trainers.Workload(
        name="stack",
        preset="tiny",
        model=used,
        dataset=SyntheticBatches((torch.randn(2, 4, 8), torch.randn(2, 4, 8))),
        loss_fn=lambda out, y: torch.nn.functional.mse_loss(out, y),
        samples_per_batch=4,
        make_optimizer=adam(1e-2),
    )
    undo = apply_block_levers(workload, LoopConfig(compile="default", compile_scope="blocks"))
    assert all(b._compiled_call_impl is not None for b in used.blocks)
    undo()
    assert [vars(b).keys() for b in used.blocks] == [vars(b).keys() for b in fresh.blocks]
    counter = CompileCounter()
    x = torch.randn(4, 8)
    for model in (used, fresh):  # two compiled modules share the forward's code object
        torch.compile(model, backend=counter)(x)
    assert counter.frame_count == 1
