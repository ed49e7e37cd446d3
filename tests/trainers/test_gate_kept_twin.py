"""An eager twin and a config run both with the process's own kernels ("off"), as the search
runs them where the trial compiled (`tuner.search.gating.kept`): the gate holds the config to
that twin's bits and records how they computed; a fault still shows in those bits; the gate
refuses a twin and a run of other kernels."""

from __future__ import annotations

import dataclasses
import math

import pytest

from trainers import Envelope, LoopConfig, RunArgs, Twin, gate
from trainers.gate import TWIN_NOISE_MULTIPLE, forget, parity_losses, within_twin_noise
from trainers.gate.faults import planted
from trainers.gate.verdict import first_difference

STEPS = 8
BF16_ARGS = RunArgs(steps=STEPS, device="cpu", precision="bf16-autocast")
# Another optimizer (arithmetic) and another sync interval (loop): owed its eager twin's bits.
CONFIG = LoopConfig(sync_interval=3, optimizer="fused")


@pytest.fixture(scope="module")
def seeds_env() -> Envelope:
    """The fp32 reference's seed envelope, as the gate measures one for another precision."""
    args = RunArgs(steps=STEPS, device="cpu", precision="fp32")
    return Envelope.measure("mlp", "tiny", args, spread="seeds", determinism="off")


@pytest.fixture(scope="module")
def off_twin() -> Twin:
    return Twin.measure("mlp", CONFIG, BF16_ARGS, preset="tiny", runs=1, determinism="off")


def _judge(envelope: Envelope, twin: Twin, losses: list[float], **extra: object) -> object:
    return gate(
        "mlp",
        CONFIG,
        BF16_ARGS,
        preset="tiny",
        envelope=envelope,
        reference_precision="fp32",
        twin=twin,
        losses=losses,
        **extra,  # type: ignore[arg-type]
    )


def test_a_config_that_replays_its_off_twin_passes_and_says_how_it_ran(
    seeds_env: Envelope, off_twin: Twin
) -> None:
    assert off_twin.determinism == "off" and not off_twin.strict
    losses = parity_losses("mlp", "tiny", CONFIG, BF16_ARGS, determinism="off")
    verdict = _judge(seeds_env, off_twin, losses, determinism="off")
    assert verdict.passed, verdict.reason  # type: ignore[attr-defined]
    assert verdict.determinism == "off"  # type: ignore[attr-defined]
    assert verdict.exact_against == "eager twin"  # type: ignore[attr-defined]
    assert "replays its eager twin bit for bit" in verdict.reason  # type: ignore[attr-defined]
    # Without the mode said, the run is taken as strict: a twin of other kernels is refused.
    with pytest.raises(ValueError, match="eager twin computed off, the config's run strict"):
        _judge(seeds_env, off_twin, losses)


def test_a_fault_in_the_config_shows_in_the_off_bits_and_fails_the_exact_test(
    seeds_env: Envelope, off_twin: Twin
) -> None:
    """The kept check accepts only bits that agree: a 1 % learning-rate error in the config's
    own run (not in its twin, measured before) leaves them, and the gate, run on those bits,
    fails it after its twin's second run (off too) reproduced the first."""
    with planted("wrong-op"):
        faulty = parity_losses("mlp", "tiny", CONFIG, BF16_ARGS, determinism="off")
    assert first_difference(faulty, off_twin.losses) is not None
    verdict = _judge(seeds_env, off_twin, faulty, determinism="off")
    assert not verdict.passed  # type: ignore[attr-defined]
    assert "does not replay its eager twin bit for bit" in verdict.reason  # type: ignore[attr-defined]


def test_how_given_losses_computed_is_checked(seeds_env: Envelope, off_twin: Twin) -> None:
    losses = list(off_twin.losses)
    with pytest.raises(ValueError, match="determinism='fast' is invalid: allowed strict, off"):
        _judge(seeds_env, off_twin, losses, determinism="fast")
    with pytest.raises(ValueError, match="determinism is how given losses computed"):
        gate("mlp", CONFIG, BF16_ARGS, preset="tiny", determinism="off")
    with pytest.raises(ValueError, match="determinism='fast' is invalid"):
        Twin.measure("mlp", CONFIG, BF16_ARGS, preset="tiny", determinism="fast")  # type: ignore[arg-type]
    # Only a run owed its eager twin's bits against a seed envelope may compute otherwise than
    # the gate would run it: a loop-settings config owes the reference's strict bits.
    fp32 = RunArgs(steps=STEPS, device="cpu", precision="fp32")
    looped = LoopConfig(sync_interval=3)
    strict = parity_losses("mlp", "tiny", looped, fp32, determinism="off")
    with pytest.raises(ValueError, match="determinism='off' is invalid here: the config's run"):
        gate("mlp", looped, fp32, preset="tiny", losses=strict, determinism="off")


def test_a_twin_keeps_how_it_computed_through_its_dict(off_twin: Twin) -> None:
    again = Twin.from_dict(off_twin.to_dict())
    assert again == off_twin and again.determinism == "off"
    older = {k: v for k, v in off_twin.to_dict().items() if k != "determinism"}
    assert Twin.from_dict(older).determinism == "strict"  # recorded before the field was


def _noisy(twin: Twin, noise: float) -> Twin:
    """`twin` as if its second run had differed from its first by `noise` at most: the kernels
    of a compiled decoder on a GPU, which differ from run to run (the CPU's reproduce)."""
    return dataclasses.replace(
        twin, runs=2, reproducible=False, first_difference=1, max_abs_difference=noise
    )


def test_where_the_off_twin_does_not_reproduce_the_config_is_held_within_its_noise(
    seeds_env: Envelope, off_twin: Twin
) -> None:
    """With the process's own kernels differing from run to run, no bit for bit test applies:
    the config passes within `TWIN_NOISE_MULTIPLE` times its twin's own difference, without the
    probe's strict runs (they would say nothing of these kernels), and a 1 % learning-rate
    error beyond it fails. Under strict determinism a twin that does not reproduce leaves the
    config to the equivalence test, as before."""
    losses = parity_losses("mlp", "tiny", CONFIG, BF16_ARGS, determinism="off")
    with planted("wrong-op"):
        faulty = parity_losses("mlp", "tiny", CONFIG, BF16_ARGS, determinism="off")
    _, fault, _ = within_twin_noise(faulty, _noisy(off_twin, 1.0))
    assert fault > 0
    noise = fault / (2 * TWIN_NOISE_MULTIPLE)  # the fault at twice the multiple
    near = [*losses[:-1], losses[-1] + 1.5 * noise]  # within: 1.5 of the twin's noise
    assert within_twin_noise(near, _noisy(off_twin, noise)) == (
        True,
        pytest.approx(1.5 * noise),
        noise,
    )
    forget()  # no probe known: the gate would measure it where the bits differ
    verdict = _judge(seeds_env, _noisy(off_twin, noise), near, determinism="off")
    assert verdict.passed, verdict.reason  # type: ignore[attr-defined]
    assert verdict.exact_against == "eager twin's noise"  # type: ignore[attr-defined]
    assert verdict.twin_noise == noise  # type: ignore[attr-defined]
    assert verdict.eager_reproducible is None  # type: ignore[attr-defined]  # no probe ran
    assert f"stays within {TWIN_NOISE_MULTIPLE:g}x its eager twin's own" in verdict.reason  # type: ignore[attr-defined]
    assert "its eager twin's two runs differ from step 1" in verdict.reason  # type: ignore[attr-defined]
    failed = _judge(seeds_env, _noisy(off_twin, noise), faulty, determinism="off")
    assert not failed.passed  # type: ignore[attr-defined]
    assert f"more than {TWIN_NOISE_MULTIPLE:g}x the twin's own run-to-run" in failed.reason  # type: ignore[attr-defined]
    # A reproducible twin, or a strict one, has no noise to be within: the bits decide.
    assert within_twin_noise(near, off_twin)[0] is False
    strict = dataclasses.replace(_noisy(off_twin, noise), determinism="strict")
    assert within_twin_noise(near, strict)[0] is False
    # A twin whose runs differ without bound (a non-finite loss in one) bounds nothing.
    assert within_twin_noise(faulty, _noisy(off_twin, math.inf))[0] is False
    assert within_twin_noise([math.nan] * len(near), _noisy(off_twin, math.inf))[0] is False
