"""The gate and precision float8 on the CPU: a config run in another precision than the reference
is owed equivalence; a float8-like fault (a wrong scale on the layers float8 converts) is
rejected, while bf16 against itself and a legitimate precision change pass.

Detection rates measured here (transformer tiny, bf16-autocast reference and envelope, 10
steps, seeds 0-4, torch 2.13 CPU): the converted layers' outputs scaled by 1.125 were rejected
for 4 of 5 seeds (ratios 1.28-2.34; seed 3 passed at 0.81; at 20 steps 5 of 5). Smaller scale
errors hide in bf16's own noise on this tiny model: 1.05 on the converted layers was rejected
for 0 of 5, 1.01 on every plain Linear for 0 of 3 (the head's logits included: 1.05 there was
rejected 5 of 5).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

import pytest
import torch
from torch import nn

from trainers import (
    REFERENCE,
    Envelope,
    LoopConfig,
    RunArgs,
    Twin,
    UnsupportedOnDevice,
    Workload,
    gate,
    load_workload,
    required_test,
)
from trainers import float8 as f8
from trainers.float8 import Float8Plan
from trainers.gate import PERTURBATIONS, spread_for
from trainers.gate.parity import exact_length
from trainers.gate.trajectories import trajectory_length
from trainers.workloads import WorkloadFactory

STEPS = 10
SEED_STEPS = 20
FAULT_SCALE = 1.125
"""One e4m3 step at 1.0 (3 mantissa bits: 2^-3): a float8 scale rounded to float8 itself instead
of kept in float32 is off by up to this much."""


def scaled_converted_linears(factor: float) -> WorkloadFactory:
    """transformer with the output of every layer float8 converts (`Float8Plan`) times
    `factor`: a float8-like fault that no LoopConfig shows, so the gate is told to test
    equivalence."""

    def build(preset: str, *, seed: int) -> Workload:
        workload = load_workload("transformer", preset, seed=seed)
        for name in Float8Plan.of(workload.model).converted:
            workload.model.get_submodule(name).register_forward_hook(_times(factor))
        return workload

    return build


def _times(factor: float) -> Callable[[nn.Module, object, torch.Tensor], torch.Tensor]:
    def hook(module: nn.Module, args: object, output: torch.Tensor) -> torch.Tensor:
        return output * factor

    return hook


def bf16_envelope(seed: int) -> Envelope:
    return Envelope.measure(
        "transformer",
        "tiny",
        RunArgs(steps=STEPS, seed=seed, device="cpu", precision="bf16-autocast"),
    )


def head_times(factor: float) -> WorkloadFactory:
    """transformer with its head's logits times `factor`: a fault that changes what is learnt
    (a softmax temperature), not only how it is rounded."""

    def build(preset: str, *, seed: int) -> Workload:
        workload = load_workload("transformer", preset, seed=seed)
        workload.model.get_submodule("head").register_forward_hook(_times(factor))
        return workload

    return build


def test_another_precision_is_judged_against_the_references_seed_to_seed_envelope() -> None:
    # No envelope given: the gate measures the one the candidate's precision is owed.
    verdict = gate(
        "transformer",
        REFERENCE,
        RunArgs(steps=SEED_STEPS, device="cpu", precision="fp32"),
        preset="tiny",
        reference_precision="bf16-autocast",
    )
    assert verdict.passed, verdict.reason
    assert "seed-to-seed envelope (4 other seeds in bf16-autocast)" in verdict.reason
    assert spread_for("float8", "bf16-autocast") == spread_for("fp32", "bf16-autocast") == "seeds"
    assert spread_for("bf16-autocast", "bf16-autocast") == spread_for(None, None) == "rounding"
    # The same precision on both sides keeps the rounding envelope.
    same = gate(
        "transformer",
        LoopConfig(num_streams=2),
        RunArgs(steps=SEED_STEPS, device="cpu"),
        preset="tiny",
    )
    assert "seed-to-seed" not in same.reason


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_seed_to_seed_envelope_rejects_a_wrong_head_scale_and_passes_bf16_itself(
    seed: int,
) -> None:
    # Measured here (20 steps, seeds 0-2, torch 2.13 CPU): logits times 2 rejected at ratios
    # 1.13-1.90, times 4 at 1.9-3.9; times 1.25 passed (0.22-0.37), as did torchao's real
    # float8 (0.009-0.02) and the converted linears' outputs times 4 (LayerNorm absorbs it).
    env = Envelope.measure(
        "transformer",
        "tiny",
        RunArgs(steps=SEED_STEPS, seed=seed, device="cpu", precision="bf16-autocast"),
        spread="seeds",
    )
    assert env.spread == "seeds" and env.perturbation_seeds == tuple(
        seed * 1000 + k for k in range(1, PERTURBATIONS + 1)
    )
    # Another seed starts from other weights: the spread is far wider than rounding's.
    rounding = Envelope.measure(
        "transformer",
        "tiny",
        RunArgs(steps=SEED_STEPS, seed=seed, device="cpu", precision="bf16-autocast"),
    )
    assert min(env.windows()) > max(rounding.windows())
    args, common = bf16_equivalence(env, seed, SEED_STEPS)
    faulty = gate(head_times(4.0), REFERENCE, args, **common)  # type: ignore[arg-type]
    itself = gate("transformer", REFERENCE, args, **common)  # type: ignore[arg-type]
    assert not faulty.passed and faulty.ratio is not None and faulty.ratio > 1.0, faulty.reason
    assert itself.passed and itself.ratio == 0.0 and itself.max_abs_deviation == 0.0
    # The rejection names the tolerance it would take, and it does take exactly that.
    least = faulty.passing_multiple
    assert least is not None and least == pytest.approx(faulty.ratio * 3.0)
    assert env.judge(faulty.losses, multiple=least * 1.001).passed
    assert not env.judge(faulty.losses, multiple=least * 0.999).passed
    # The figure the reason shows (3 digits, rounded up) is one a user can set and pass at.
    shown = float(re.search(r"it would pass within ([0-9.]+)x the envelope", faulty.reason)[1])  # type: ignore[index]
    assert least <= shown < least * 1.01 and env.judge(faulty.losses, multiple=shown).passed
    assert itself.passing_multiple == 0.0 and "would pass" not in itself.reason


def test_an_envelopes_spread_round_trips_and_is_checked() -> None:
    env = Envelope.measure(
        "mlp", "tiny", RunArgs(steps=4, device="cpu"), perturbations=1, spread="seeds"
    )
    data = env.to_dict()
    assert Envelope.from_dict(data) == env and data["spread"] == "seeds"
    # An envelope stored before spreads existed was a rounding envelope.
    older = {k: v for k, v in data.items() if k != "spread"}
    assert Envelope.from_dict(older).spread == "rounding"
    with pytest.raises(ValueError, match=r"spread='ulps' is invalid: allowed rounding, seeds"):
        Envelope.from_dict({**data, "spread": "ulps"})
    with pytest.raises(ValueError, match=r"spread='ulps' is invalid: allowed rounding, seeds"):
        Envelope.measure("mlp", "tiny", RunArgs(steps=4, device="cpu"), spread="ulps")


def bf16_equivalence(env: Envelope, seed: int, steps: int) -> tuple[RunArgs, dict[str, object]]:
    """`gate`'s arguments for the equivalence test against `env` on transformer tiny, in bf16:
    its runs' and the rest."""
    args = RunArgs(steps=steps, seed=seed, device="cpu", precision="bf16-autocast")
    return args, {"preset": "tiny", "envelope": env, "test": "equivalence"}


def test_another_precision_than_the_references_is_owed_equivalence() -> None:
    def owed(config: LoopConfig) -> str:
        return required_test(config, precision="float8", reference_precision="bf16-autocast")

    assert owed(REFERENCE) == "equivalence"
    assert owed(LoopConfig(compile="default")) == "equivalence"
    # With loop settings or a graph: also its eager twin's bits, in its own precision.
    assert owed(LoopConfig(num_streams=2)) == "exact+equivalence"
    assert owed(LoopConfig(cuda_graph=True)) == "exact+equivalence"
    # The same precision on both sides changes nothing: a loop-only config stays exact.
    assert required_test(REFERENCE, precision="float8") == "exact"
    assert required_test(REFERENCE, precision="float8", reference_precision="float8") == "exact"
    assert required_test(LoopConfig(num_streams=2), precision="bf16-autocast") == "exact"


def test_a_long_cross_precision_judgement_holds_only_its_first_steps_to_the_twins_bits() -> None:
    # fp32 against a bf16 reference, as float8 is judged: 8 steps for equivalence, its twin's
    # bits over the first 4 (`exact_steps`).
    config = LoopConfig(num_streams=2, sync_interval=3)
    args = RunArgs(steps=8, device="cpu", precision="fp32")
    common = {
        "preset": "tiny",
        "reference_precision": "bf16-autocast",
        "envelope": Envelope.measure(
            "transformer",
            "tiny",
            RunArgs(steps=8, device="cpu", precision="bf16-autocast"),
            perturbations=2,
            spread="seeds",
            determinism="off",
        ),
    }
    assert common["envelope"].strict is False  # type: ignore[union-attr]
    verdict = gate("transformer", config, args, exact_steps=4, **common)  # type: ignore[arg-type]
    assert verdict.passed, verdict.reason
    assert verdict.test == "exact+equivalence" and verdict.exact_against == "eager twin"
    assert (verdict.steps, len(verdict.losses), verdict.exact_steps) == (8, 8, 4)
    assert (verdict.determinism, verdict.reference_determinism) == ("strict", "off")
    assert verdict.twin_max_abs_deviation == 0.0 and "bit for bit" in verdict.reason
    # A twin whose bits differ within those first steps fails the exact test.
    twin = Twin.measure(
        "transformer", config, RunArgs(steps=4, device="cpu", precision="fp32"), preset="tiny"
    )
    assert len(twin.losses) == 4
    wrong = dataclasses.replace(
        twin, losses=(*twin.losses[:2], twin.losses[2] * 1.001, twin.losses[3])
    )
    failed = gate("transformer", config, args, exact_steps=4, twin=wrong, **common)  # type: ignore[arg-type]
    assert not failed.passed and failed.twin_first_diverging_step == 2, failed.reason
    # A twin of another length, or exact steps beyond the run, is refused.
    with pytest.raises(ValueError, match="twin ran 4 steps, the exact test runs 3"):
        gate("transformer", config, args, exact_steps=3, twin=twin, **common)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"exact_steps=9 is invalid: allowed 1 to steps \(8\)"):
        gate("transformer", config, args, exact_steps=9, **common)  # type: ignore[arg-type]
    # A given envelope's own determinism is what the verdict reports.
    strict = dataclasses.replace(common["envelope"], determinism="strict")  # type: ignore[type-var]
    assert (
        gate(  # type: ignore[misc]
            "transformer", config, args, exact_steps=4, **(common | {"envelope": strict})
        ).reference_determinism
        == "strict"
    )
    # Across precisions no test is bit for bit: a forced exact one is refused.
    with pytest.raises(ValueError, match="test='exact' is invalid for a config in fp32"):
        gate("transformer", config, args, test="exact", **common)  # type: ignore[arg-type]


def test_the_exact_tests_cover_the_warm_up_and_an_exact_test_the_whole_run() -> None:
    graph = LoopConfig(cuda_graph=True)
    # A graph's twin runs past its eager warm-up and capture: they alone would hide a capture
    # bug.
    assert exact_length(graph, "exact+equivalence", 200, 2) == trajectory_length(graph, 2) > 4
    assert exact_length(LoopConfig(num_streams=2), "exact+equivalence", 200, 20) == 20
    # An exact test against the reference compares the whole run, whatever was asked.
    assert exact_length(LoopConfig(num_streams=2), "exact", 200, 20) == 200
    verdict = gate(
        "mlp",
        LoopConfig(num_streams=2),
        RunArgs(steps=6, device="cpu"),
        preset="tiny",
        exact_steps=2,
    )
    assert verdict.test == "exact" and verdict.passed and verdict.exact_steps == 6


def test_a_float8_candidate_on_a_cpu_is_refused_before_the_reference_runs() -> None:
    with pytest.raises(UnsupportedOnDevice, match=r"^precision='float8': float8 matmuls need"):
        gate(
            "transformer",
            REFERENCE,
            RunArgs(steps=STEPS, device="cpu", precision="float8"),
            preset="tiny",
            reference_precision="bf16-autocast",
        )


@pytest.mark.slow
def test_the_gate_rejects_a_float8_like_fault_and_accepts_bf16_against_itself() -> None:
    seeds = range(5)
    detected = 0
    for seed in seeds:
        args, common = bf16_equivalence(bf16_envelope(seed), seed, STEPS)
        faulty = gate(scaled_converted_linears(FAULT_SCALE), REFERENCE, args, **common)  # type: ignore[arg-type]
        control = gate(scaled_converted_linears(1.0), REFERENCE, args, **common)  # type: ignore[arg-type]
        itself = gate("transformer", REFERENCE, args, **common)  # type: ignore[arg-type]
        assert faulty.test == "equivalence" and faulty.ratio is not None
        detected += not faulty.passed
        if not faulty.passed:
            assert faulty.ratio > 1.0
            assert "exceeds" in faulty.reason, faulty.reason
        for same in (control, itself):
            assert same.passed and same.ratio == 0.0 and same.max_abs_deviation == 0.0
            assert same.precision == same.reference_precision == "bf16-autocast"
    assert detected >= 4, f"{detected}/5 detected"


def test_a_legitimate_precision_change_is_judged_against_the_references_envelope() -> None:
    env = bf16_envelope(0)
    verdict = gate(
        "transformer",
        REFERENCE,
        RunArgs(steps=STEPS, device="cpu", precision="fp32"),
        preset="tiny",
        envelope=env,
        reference_precision="bf16-autocast",
    )
    assert verdict.test == "equivalence" and not verdict.exact_required
    assert verdict.precision == "fp32" and verdict.reference_precision == "bf16-autocast"
    assert verdict.max_abs_deviation > 0.0  # another precision: never bit for bit
    assert verdict.passed and verdict.ratio is not None and verdict.ratio < 1.0, verdict.reason
    # An envelope of the candidate's precision is not the reference's: refused.
    with pytest.raises(ValueError, match="envelope measured for"):
        gate(
            "transformer",
            REFERENCE,
            RunArgs(steps=STEPS, device="cpu", precision="fp32"),
            preset="tiny",
            envelope=env,
        )


def test_real_float8_is_judged_by_equivalence_against_bf16(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("torchao.float8", reason=f"torchao is not installed: {f8.INSTALL}")
    # The device rule is ours; torch's CPU `_scaled_mm` computes float8 matmuls, slowly.
    monkeypatch.setattr(f8, "device_error", lambda device: None)
    verdict = gate(
        "transformer",
        REFERENCE,
        RunArgs(steps=STEPS, device="cpu", precision="float8"),
        preset="tiny",
        envelope=bf16_envelope(0),
        reference_precision="bf16-autocast",
    )
    assert verdict.test == "equivalence" and verdict.exact_against is None
    assert verdict.precision == "float8" and verdict.reference_precision == "bf16-autocast"
    assert verdict.max_abs_deviation > 0.0
    # Measured here: float8 stayed inside bf16's envelope on this model (ratio 0.38 at seed 0).
    assert verdict.passed and verdict.ratio is not None and verdict.ratio < 1.0, verdict.reason
