"""An eager twin and a config run both with the process's own kernels ("off"), as the search
runs them where the trial compiled (`tuner.search.gating.kept`): the gate holds the config to
that twin's bits and records how they computed; a fault still shows in those bits; the gate
refuses a twin and a run of other kernels."""

from __future__ import annotations

import pytest

from trainers import Envelope, LoopConfig, RunArgs, Twin, gate
from trainers.gate import parity_losses
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
