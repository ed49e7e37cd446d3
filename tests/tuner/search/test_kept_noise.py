"""The search's kept check where the process's own kernels do not reproduce
(`tuner.search.gating.kept.run_kept`): its twin runs a second time, and the config is taken
within `TWIN_NOISE_MULTIPLE` times the twin's own run-to-run difference, or left to the strict
child with the reason said. On a GPU a compiled decoder's kernels differ from run to run
(docs/benchmarks/kept-bits-h100-*); the CPU's reproduce, so the workload here reports a loss
that each build offsets a little more, as such kernels would: the runs' bits differ, their
training does not."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.utils.data import TensorDataset

from trainers import LoopConfig, RunArgs, workload_from_parts
from trainers.gate import TWIN_NOISE_MULTIPLE, gate, parity_losses
from trainers.gate.faults import planted
from trainers.workloads import Workload
from tuner.search.gating import kept

OFFSET = 1e-4
"""Each build's loss is this much above the previous build's (no gradient flows through it)."""
_builds = itertools.count()
ARGS = RunArgs(steps=6, device="cpu", precision="bf16-autocast")
CONFIG = LoopConfig(sync_interval=3, optimizer="fused")  # owed its eager twin's bits


def drifting(preset: str, *, seed: int) -> Workload:
    """A small regression whose reported loss carries the build's offset."""
    gen = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
    data = TensorDataset(torch.randn(48, 8, generator=gen), torch.randn(48, 4, generator=gen))
    offset = OFFSET * next(_builds)

    def loss(m: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return torch.nn.functional.mse_loss(m(batch[0]), batch[1]) + offset

    return workload_from_parts(model, data, loss, batch_size=8, optimizer=torch.optim.SGD)


def test_a_config_within_its_twins_noise_is_taken_and_a_fault_beyond_it_is_left_to_the_child(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = kept.run_kept(drifting, "tiny", CONFIG, ARGS, config_precision="bf16-autocast")
    assert run.twin is not None and run.apart is None, run.apart
    twin = run.twin.twin
    # Twin, config, then the twin again: the config is nearer the first than the second is.
    assert twin.runs == 2 and twin.reproducible is False and twin.first_difference == 0
    assert twin.max_abs_difference == pytest.approx(2 * OFFSET, rel=0.05)
    assert {"gate_twin", "gate_config"} <= set(run.time)
    verdict = gate(
        drifting,
        CONFIG,
        ARGS,
        preset="tiny",
        twin=twin,
        losses=run.losses,
        determinism="off",
        reference_precision="fp32",
    )
    assert verdict.passed, verdict.reason
    assert verdict.exact_against == "eager twin's noise" and verdict.twin_noise is not None
    assert f"stays within {TWIN_NOISE_MULTIPLE:g}x" in verdict.reason

    def faulty(*args: object, **kwargs: object) -> list[float]:
        with planted("wrong-op"):
            return parity_losses(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(kept, "parity_losses", faulty)
    wrong = kept.run_kept(drifting, "tiny", CONFIG, ARGS.replace(steps=12))
    assert wrong.twin is None and wrong.apart is not None
    assert wrong.apart.startswith("its kept run left its twin by ")
    noise = f"{2 * OFFSET:.2g}"
    assert wrong.apart.endswith(
        f"more than {TWIN_NOISE_MULTIPLE:g}x the twin's own run-to-run difference ({noise})"
    )
