"""`trainers.Trainer` on a GPU, under the configs a CPU cannot run: a whole-step CUDA graph (eager
and over a compiled step), reduce-overhead, several streams. Resume must equal the uninterrupted
run bit for bit, the schedule must reach a captured optimizer (its rate a device tensor),
accumulation and clipping must be captured with the step. Skipped without CUDA."""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import trainers
from trainers import LoopConfig, Trainer, fit, workload_from_parts
from trainers.optim import with_capturable

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

FEED = dict(num_streams=2, sync_mode="event", sync_interval=5, prefetch_depth=2, pin_memory=True)
CONFIGS = {
    "graph": LoopConfig(**FEED, non_blocking=True, cuda_graph=True),
    "graph-fused": LoopConfig(**FEED, non_blocking=True, cuda_graph=True, optimizer="fused"),
    "compile-graph": LoopConfig(**FEED, non_blocking=True, cuda_graph=True, compile="default"),
    "reduce-overhead": LoopConfig(**FEED, non_blocking=True, compile="reduce-overhead"),
    "four-streams-query": LoopConfig(num_streams=4, sync_mode="query", sync_interval=3),
}


# Read when cuBLAS makes its handle: set at import, before any test of the session runs a kernel.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@contextlib.contextmanager
def same_kernels(config: LoopConfig) -> Iterator[None]:
    """Deterministic kernels under a compiled config. Inductor's step is not run-to-run exact
    without them: on an H100 (2026-12-06, torch 2.11) two uninterrupted compile-graph runs of 16
    steps, each compiled afresh, differed by one ulp at steps 4, 5 and 7, under Inductor's own
    deterministic mode too; with `torch.use_deterministic_algorithms(True)` they were equal,
    and every resume equalled its uninterrupted run. The Trainer restores its state exactly;
    kernels that add in another order on each run are not its to repeat."""
    if config.compile == "none":
        yield
        return
    import torch._inductor.config

    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        with torch._inductor.config.patch(deterministic=True):
            yield
    finally:
        torch.use_deterministic_algorithms(before)


def warmup_cosine(total: int, warmup: int = 3):  # type: ignore[no-untyped-def]
    return fit.warmup_cosine(total, warmup, start_factor=0.1)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_resumed_run_gives_the_uninterrupted_losses_bit_for_bit(
    name: str, tmp_path: Path
) -> None:
    options = dict(
        config=CONFIGS[name],
        device="cuda",
        scheduler=warmup_cosine(16),
        clip_grad_norm=0.5,
        # reduce-overhead refuses accumulation (trainers/fit.py says why); the others accumulate.
        accumulate=1 if CONFIGS[name].compile == "reduce-overhead" else 2,
    )

    def make() -> trainers.Workload:
        torch._dynamo.reset()  # each Trainer compiles as a new process would (see same_kernels)
        return trainers.load_workload("transformer", "tiny", seed=0)

    with same_kernels(CONFIGS[name]):
        whole = Trainer(make(), **options).fit(16)
        Trainer(make(), **options).fit(8, checkpoint_every=8, checkpoint_path=tmp_path / "c.pt")
        resumed = Trainer(make(), **options).fit(16, resume_from=tmp_path / "c.pt")
    assert resumed.losses == whole.losses[8:]
    assert len(set(whole.losses)) > 8


def linear_probe(make_optimizer) -> trainers.Workload:  # type: ignore[no-untyped-def]
    """loss = sum(w): every gradient is 1. Plain SGD moves w by the step's rate; so does Adam
    with eps=0 (a constant gradient makes m_hat / sqrt(v_hat) exactly 1)."""
    model = nn.Linear(1, 1, bias=False).double()
    with torch.no_grad():
        model.weight.fill_(1.0)

    def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return model.weight.sum() + 0.0 * batch[0].sum()

    return workload_from_parts(
        model,
        TensorDataset(torch.zeros(64, 1, dtype=torch.float64)),
        loss_fn,
        optimizer=make_optimizer,
        batch_size=4,
    )


def adam(params, capturable: bool) -> torch.optim.Optimizer:  # type: ignore[no-untyped-def]
    return torch.optim.Adam(params, lr=0.5, eps=0.0, capturable=capturable)


def test_a_captured_optimizer_follows_the_schedule_through_a_tensor_rate() -> None:
    schedule = warmup_cosine(12)
    trainer = Trainer(
        linear_probe(adam), LoopConfig(cuda_graph=True), device="cuda", scheduler=schedule
    )
    assert isinstance(trainer.optimizer.param_groups[0]["lr"], torch.Tensor)
    weights = [float(trainer.model.weight.detach())]
    trainer.fit(
        12, on_losses=lambda first, losses: weights.append(float(trainer.model.weight.detach()))
    )
    applied = [a - b for a, b in itertools.pairwise(weights)]
    reference = torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.5)
    scheduler = schedule(reference)
    expected = []
    for _ in range(12):
        expected.append(reference.param_groups[0]["lr"])
        reference.step()
        scheduler.step()
    # Capturable Adam computes its bias corrections from a float32 step counter: 1 - 0.999 in
    # float32 is off by 1.3e-5 relative, and the step carries its square root (6.4e-6, seen on an
    # H100). A rate off by one schedule step would be off by more than 10 %.
    assert applied == pytest.approx(expected, rel=2e-5)
    # A float rate would be baked into the graph at capture: refused.
    with pytest.raises(trainers.ConfigError, match=r"^lr_tensor=False is invalid"):
        Trainer(
            linear_probe(adam),
            LoopConfig(cuda_graph=True),
            device="cuda",
            scheduler=schedule,
            lr_tensor=False,
        )


def test_a_schedule_over_a_graph_of_an_optimizer_that_reads_its_rate_on_the_host_is_refused() -> (
    None
):
    sgd = linear_probe(lambda params, capturable: torch.optim.SGD(params, lr=0.5))
    with pytest.raises(trainers.ConfigError, match="optimizer='fused', or one built with capt"):
        Trainer(sgd, LoopConfig(cuda_graph=True), device="cuda", scheduler=warmup_cosine(12))


def test_accumulation_and_clipping_are_captured_with_the_step() -> None:
    """The graph's losses follow its eager twin (same capturable optimizer, same order of
    operations) within float32 rounding."""

    def losses(config: LoopConfig) -> list[float]:
        workload = trainers.load_workload("transformer", "tiny", seed=0)
        trainer = Trainer(workload, config, device="cuda", clip_grad_norm=0.1, accumulate=3)
        if not config.cuda_graph:
            trainer.optimizer = with_capturable(trainer.optimizer, True)
        return trainer.fit(12).losses

    graph = losses(CONFIGS["graph"])
    eager = losses(CONFIGS["graph"].replace(cuda_graph=False))
    assert graph == pytest.approx(eager, rel=1e-5)


def test_a_captured_optimizer_holds_still_past_the_end_of_warmup_cosine() -> None:
    """The schedule's third phase (rate 0 after `total_steps`) reaches the graph's tensor rate:
    the periodic cosine had climbed back there (2026-12-05, proven on the CPU only)."""
    trainer = Trainer(
        linear_probe(adam), LoopConfig(cuda_graph=True), device="cuda", scheduler=warmup_cosine(6)
    )
    weights = [float(trainer.model.weight.detach())]
    trainer.fit(
        12,
        on_losses=lambda first, losses: weights.append(float(trainer.model.weight.detach())),
    )
    applied = [a - b for a, b in itertools.pairwise(weights)]
    assert all(step > 0 for step in applied[:5]) and applied[6:] == [0.0] * 6


@pytest.mark.parametrize("name", ["graph", "compile-graph"])
def test_a_callback_error_under_a_graph_leaves_the_run_resumable(name: str) -> None:
    """A loss callback that raises is re-raised once its step is counted (`Deferred`): the run
    continued after it ends with the uninterrupted run's weights bit for bit."""
    config = CONFIGS[name].replace(sync_interval=1)

    def build() -> Trainer:
        torch._dynamo.reset()  # as a new process would compile (see same_kernels)
        workload = trainers.load_workload("transformer", "tiny", seed=0)
        return Trainer(workload, config, device="cuda", scheduler=warmup_cosine(8))

    def fails(first: int, losses: list[float]) -> None:
        if first + len(losses) >= 3:
            raise RuntimeError("planted: the callback failed")

    with same_kernels(config):
        trainer = build()
        with pytest.raises(RuntimeError, match="planted"):
            trainer.fit(8, on_losses=fails)
        assert 3 <= trainer.step < 8
        trainer.fit(8)
        plain = build()
        plain.fit(8)
    for ours, theirs in zip(trainer.model.parameters(), plain.model.parameters(), strict=True):
        assert torch.equal(ours, theirs)


def test_a_frozen_batchnorm_stays_frozen_under_a_captured_step() -> None:
    """A submodule the user put in eval mode keeps it through `fit` and `evaluate`, also in a
    whole-step graph, whose losses follow the eager loop's."""

    def build(config: LoopConfig) -> tuple[Trainer, nn.Module]:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))
        model[1].running_mean.fill_(0.25)
        model[1].eval()
        g = torch.Generator().manual_seed(1)
        data = TensorDataset(
            torch.randn(96, 16, generator=g), torch.randint(0, 4, (96,), generator=g)
        )

        def loss_fn(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
            return nn.functional.cross_entropy(model(batch[0]), batch[1])

        # Adam's own eps: `adam` above (eps=0) turns a unit the ReLU left without a gradient
        # into 0/0, NaN from step 2 on an H100 (2026-12-06), in the eager loop as in the graph.
        optimizer = lambda params, capturable: torch.optim.Adam(  # noqa: E731
            params, lr=0.01, capturable=capturable
        )
        workload = workload_from_parts(model, data, loss_fn, optimizer=optimizer, batch_size=8)
        held_out = [(torch.randn(8, 16), torch.randint(0, 4, (8,)))]
        trainer = Trainer(workload, config, device="cuda", eval_data=held_out)
        if not config.cuda_graph:
            trainer.optimizer = with_capturable(trainer.optimizer, True)
        return trainer, model

    graph, model = build(CONFIGS["graph"])
    result = graph.fit(12, eval_every=6)
    assert [m.training for m in model] == [True, False, True, True]
    assert torch.equal(model[1].running_mean.cpu(), torch.full((32,), 0.25))
    eager, _ = build(CONFIGS["graph"].replace(cuda_graph=False))
    assert result.losses == pytest.approx(eager.fit(12).losses, rel=1e-5)


@pytest.mark.parametrize("name", ["graph", "compile-graph", "four-streams-query"])
def test_a_nan_loss_is_said_where_the_sync_mode_harvests_it(name: str) -> None:
    """A NaN feature in the fifth batch: `NonFiniteLoss` names step 5 once the config's own
    harvest brings that loss home (a captured step's loss too), no later than its sync point."""
    config = CONFIGS[name]
    torch.manual_seed(0)
    features = torch.randn(128, 6)
    features[35, 2] = float("nan")  # sample 35 of batches of 8: step 5, counted from 1
    workload = workload_from_parts(
        nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1)),
        TensorDataset(features, torch.randn(128, 1)),
        lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]),
        optimizer=lambda params, capturable: torch.optim.SGD(params, lr=0.1),
        batch_size=8,
    )
    torch._dynamo.reset()
    trainer = Trainer(workload, config, device="cuda")
    with pytest.raises(trainers.NonFiniteLoss, match="the loss of step 5 is nan") as caught:
        trainer.fit(16)
    # Found at a sync point: the query mode's may lag by the steps still in flight.
    assert 5 <= trainer.step <= 16
    assert f"stopped after step {trainer.step}," in str(caught.value)
    assert trainer.fit(20, allow_nonfinite=True).step == 20  # allowed: it trains on


def _nan_at_step_5() -> trainers.Workload:
    torch.manual_seed(0)
    features = torch.randn(128, 6)
    features[35, 2] = float("nan")  # sample 35 of batches of 8: step 5, counted from 1
    return workload_from_parts(
        nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1)),
        TensorDataset(features, torch.randn(128, 1)),
        lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]),
        optimizer=lambda params, capturable: torch.optim.SGD(params, lr=0.1),
        batch_size=8,
    )


@pytest.mark.parametrize("name", ["graph", "compile-graph", "four-streams-query"])
def test_no_checkpoint_is_written_after_a_nan_loss_on_the_gpu(name: str, tmp_path: Path) -> None:
    """The checkpoint due at step 6 drains the losses first and the NaN of step 5 stops the
    fit before it: `run.pt` keeps step 4's finite weights, which the error says to resume from
    (the NaN weights had been written over them)."""
    torch._dynamo.reset()
    trainer = Trainer(_nan_at_step_5(), CONFIGS[name], device="cuda")
    with pytest.raises(trainers.NonFiniteLoss, match="the loss of step 5 is nan"):
        trainer.fit(16, checkpoint_every=2, checkpoint_path=tmp_path / "run.pt")
    state = torch.load(tmp_path / "run.pt", weights_only=True)
    assert state["step"] == 4
    assert all(torch.isfinite(value).all() for value in state["model"].values())


@pytest.mark.parametrize("name", ["graph", "compile-graph", "four-streams-query"])
def test_a_float64_batch_is_one_line_naming_data_on_the_gpu(name: str) -> None:
    """NumPy's float64 features: under a captured, a compiled-and-captured and a four-stream
    step alike, one line naming `data`, not torch's (or Dynamo's) traceback."""
    torch.manual_seed(0)
    workload = workload_from_parts(
        nn.Linear(6, 1),
        TensorDataset(torch.randn(64, 6, dtype=torch.float64), torch.randn(64, 1)),
        lambda m, b: nn.functional.mse_loss(m(b[0]), b[1]),
        optimizer=lambda params, capturable: torch.optim.SGD(params, lr=0.1),
        batch_size=8,
    )
    torch._dynamo.reset()
    trainer = Trainer(workload, CONFIGS[name], device="cuda")
    with pytest.raises(trainers.WorkloadError, match=r"^data: step 1 raised .*Double.*float64"):
        trainer.fit(4)
    assert trainer.step == 0
