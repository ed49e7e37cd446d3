"""The noise envelope, measured for real on the tiny built-ins, and its JSON round trip."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import pytest
import torch

from trainers import Envelope, LoopConfig, RunArgs, gate, load_workload, parity_losses
from trainers.gate.envelope import FORMAT, envelope_seeds, rounding_eps
from trainers.gate.equivalence import FLOAT32_EPS
from trainers.gate.trajectories import Perturbation


@pytest.fixture(scope="module")
def mlp_envelope() -> Envelope:
    return Envelope.measure("mlp", "tiny", RunArgs(steps=10, seed=3, device="cpu"), perturbations=3)


def test_envelope_of_a_tiny_model_is_deterministic_finite_and_floored(
    mlp_envelope: Envelope,
) -> None:
    env = mlp_envelope
    again = Envelope.measure(
        "mlp", "tiny", RunArgs(steps=10, seed=3, device="cpu"), perturbations=3
    )
    assert again == env
    assert env.workload == "mlp" and env.preset == "tiny" and env.steps == 10
    assert env.reference == tuple(
        parity_losses("mlp", "tiny", LoopConfig(), RunArgs(steps=10, seed=3, device="cpu"))
    )
    assert len(env.perturbed) == 3 and all(len(run) == 10 for run in env.perturbed)
    assert env.perturbed[0] != env.reference  # the perturbation reaches the losses
    windows = env.windows(5)
    assert len(windows) == 2 and all(math.isfinite(e) and e >= 0 for e in windows)
    assert env.floor == pytest.approx(16 * FLOAT32_EPS * max(env.reference))
    assert env.strict and env.eps is None and env.device == "cpu" and env.hardware == "cpu"
    # The reference itself and a rounding-sized shift pass; a real shift does not.
    assert env.judge(list(env.reference)).ratio == 0.0
    assert env.judge([x + env.floor for x in env.reference]).passed
    assert not env.judge([x + 1e-3 for x in env.reference]).passed


def test_envelope_reuses_a_given_reference_and_differs_by_seed(mlp_envelope: Envelope) -> None:
    reused = Envelope.measure(
        "mlp",
        "tiny",
        RunArgs(steps=10, seed=3, device="cpu"),
        perturbations=1,
        reference=mlp_envelope.reference,
    )
    assert reused.reference == mlp_envelope.reference
    assert reused.perturbed == mlp_envelope.perturbed[:1]
    other = Envelope.measure(
        "transformer", "tiny", RunArgs(steps=6, seed=4, device="cpu"), perturbations=2
    )
    assert other.perturbation_seeds == (4001, 4002)
    assert all(e >= 0 for e in other.windows(3))


def test_envelope_json_round_trip(mlp_envelope: Envelope) -> None:
    values = json.loads(json.dumps(mlp_envelope.to_dict()))
    assert values["format"] == FORMAT
    assert values["envelope"] == pytest.approx(mlp_envelope.windows())
    assert values["floor"] == pytest.approx(mlp_envelope.floor)
    restored = Envelope.from_dict(values)
    assert restored == mlp_envelope
    assert restored.judge(list(mlp_envelope.reference)).passed
    with pytest.raises(ValueError, match="format"):
        Envelope.from_dict({**values, "format": 99})
    with pytest.raises(ValueError, match="lacks reference"):
        Envelope.from_dict({k: v for k, v in values.items() if k != "reference"})
    with pytest.raises(ValueError, match="length"):
        Envelope.from_dict({**values, "perturbed": [values["reference"][:-1]]})


def test_a_stored_loss_that_was_not_finite_reads_back_as_nan_and_fails_its_check(
    mlp_envelope: Envelope,
) -> None:
    """JSON stores NaN and infinities as null (`json_safe`); read back they are NaN, and a
    check against the envelope says the reference is not finite (it was a TypeError)."""
    values = json.loads(json.dumps(mlp_envelope.to_dict()))
    values["reference"] = [None, *values["reference"][1:]]
    restored = Envelope.from_dict(values)
    assert math.isnan(restored.reference[0])
    verdict = restored.judge(list(mlp_envelope.reference))
    assert not verdict.passed and "the reference's loss is not finite at step 0" in verdict.reason


def test_perturbation_moves_each_weight_by_one_or_two_ulps_both_ways() -> None:
    model = load_workload("mlp", "tiny", seed=0).model
    before = [p.detach().clone() for p in model.parameters()]
    Perturbation(seed=1).apply(model)
    steps = []
    for old, new in zip(before, model.parameters(), strict=True):
        ulp = torch.finfo(torch.float32).eps * 2.0 ** torch.floor(torch.log2(old.abs()))
        moved = ((new.detach() - old) / ulp)[old != 0]
        steps.append(moved)
    moved = torch.cat(steps)
    assert set(moved.abs().round().unique().tolist()) <= {1.0, 2.0}
    assert (moved > 0).float().mean().item() == pytest.approx(0.5, abs=0.1)
    coarse = load_workload("mlp", "tiny", seed=0).model
    Perturbation(seed=1, eps=2.0**-10).apply(coarse)
    first = next(coarse.parameters()).detach()
    assert ((first - before[0]).abs() / before[0].abs()).max().item() == pytest.approx(
        2.0**-10, rel=1e-3
    )


def test_rounding_eps_follows_the_compute_precision() -> None:
    assert rounding_eps("fp32", "high") is None  # fp32 runs at "highest" whatever the process
    assert rounding_eps("tf32", "highest") == 2.0**-10
    assert rounding_eps("bf16-autocast", "highest") == 2.0**-7
    assert rounding_eps("fp16-autocast", "highest") == 2.0**-10
    assert rounding_eps(None, "highest") is None
    assert rounding_eps(None, "high") == 2.0**-10
    assert rounding_eps(None, "medium") == 2.0**-7


def test_envelope_records_what_it_was_measured_under() -> None:
    env = Envelope.measure(
        "mlp",
        "tiny",
        RunArgs(steps=4, seed=0, device="cpu", precision="fp32"),
        perturbations=1,
        eps=1e-6,
    )
    assert env.precision == "fp32" and env.matmul_precision == "highest" and env.eps == 1e-6
    assert dataclasses.replace(env, steps=5) != env
    with pytest.raises(ValueError, match="perturbations"):
        Envelope.measure("mlp", "tiny", RunArgs(steps=4, device="cpu"), perturbations=0)


def test_an_envelope_records_the_determinism_its_runs_were_asked_for() -> None:
    off = Envelope.measure(
        "mlp",
        "tiny",
        RunArgs(steps=3, device="cpu"),
        perturbations=1,
        spread="seeds",
        determinism="off",
    )
    assert off.determinism == "off" and off.strict is False
    assert Envelope.from_dict(off.to_dict()) == off
    # Stored before it was recorded: every envelope then ran strict.
    old = {k: v for k, v in off.to_dict().items() if k != "determinism"}
    assert Envelope.from_dict(old).determinism == "strict"
    with pytest.raises(ValueError, match="envelope determinism='loose' is invalid: allowed"):
        Envelope.from_dict(off.to_dict() | {"determinism": "loose"})


PRETRAINED = """
import torch
from torch.utils.data import TensorDataset
from trainers import workload_from_parts

def pretrained(preset, *, seed):
    # Weights loaded, not drawn: every seed builds this one model.
    gen = torch.Generator().manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.randn(param.shape, generator=gen) * 0.5)
    data = TensorDataset(torch.randn(16, 8, generator=gen), torch.randn(16, 4, generator=gen))
    return workload_from_parts(
        model, data, lambda m, b: torch.nn.functional.mse_loss(m(b[0]), b[1]), batch_size=8,
        optimizer=torch.optim.SGD,
    )
"""


def test_a_seed_envelope_of_one_model_from_every_seed_is_flat_and_the_verdict_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pretrained weights from every seed and the same batches: the seed envelope is the loss
    floor alone, so another precision fails it, and the verdict says why rather than only by
    what multiple."""
    (tmp_path / "pretrained_mod.py").write_text(PRETRAINED)
    monkeypatch.syspath_prepend(str(tmp_path))
    fp32 = RunArgs(steps=4, device="cpu", precision="fp32")
    flat = Envelope.measure(
        "pretrained_mod:pretrained",
        "tiny",
        fp32,
        perturbations=2,
        spread="seeds",
        determinism="off",
    )
    assert flat.flat and flat.windows(2) == [0.0, 0.0]
    # The first seed repeated the reference's losses: the second is not trained.
    assert len(flat.perturbed) == 1 and flat.perturbation_seeds == envelope_seeds(0, 1)
    assert Envelope.from_dict(flat.to_dict()) == flat
    verdict = gate(
        "pretrained_mod:pretrained",
        LoopConfig(),
        fp32.replace(precision="bf16-autocast"),
        preset="tiny",
        envelope=flat,
        reference_precision="fp32",
    )
    assert not verdict.passed
    assert "every seed gave the reference's own losses" in verdict.reason
    assert "(1 other seed in fp32)" in verdict.reason
    assert "'pretrained_mod:pretrained' builds the same weights from every seed" in verdict.reason
    # The built-in draws its weights from the seed: a spread, and no such words.
    drawn = Envelope.measure(
        "mlp", "tiny", fp32, perturbations=2, spread="seeds", determinism="off"
    )
    assert not drawn.flat and len(drawn.perturbed) == 2
    assert drawn.judged_against() == (
        "judged against the reference's seed-to-seed envelope (2 other seeds in fp32)"
    )
