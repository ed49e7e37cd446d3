"""The equivalence statistic on constructed trajectories: what passes, what fails and why."""

from __future__ import annotations

import json
import math
import random
import re

import pytest

from trainers.gate.equivalence import (
    FLOAT32_EPS,
    FLOOR_ULPS,
    MULTIPLE,
    judge,
    loss_floor,
    window_deviations,
    window_envelope,
    window_spans,
)
from trainers.gate.parity import GRAPH_RTOL, compare

STEPS = 20


def reference(steps: int = STEPS) -> list[float]:
    return [2.3 * math.exp(-0.1 * t) for t in range(steps)]


def noise(seed: int, scale: float = 1e-6, growth: float = 1.15) -> list[float]:
    """Rounding-like noise: a random sign per step, growing as training amplifies it."""
    rng = random.Random(seed)
    return [scale * growth**t * rng.choice((-1.0, 1.0)) for t in range(STEPS)]


def perturbed(ref: list[float], k: int = 4) -> list[list[float]]:
    return [[r + n for r, n in zip(ref, noise(seed), strict=True)] for seed in range(k)]


def test_windows_split_the_steps_into_nearly_equal_consecutive_spans() -> None:
    assert window_spans(20, 5) == [(0, 5), (5, 10), (10, 15), (15, 20)]
    assert window_spans(16, 5) == [(0, 6), (6, 11), (11, 16)]
    assert window_spans(3, 5) == [(0, 3)]
    assert window_spans(0, 5) == []
    with pytest.raises(ValueError, match="window=0"):
        window_spans(10, 0)


def test_window_deviation_is_the_mean_absolute_difference() -> None:
    ref = [1.0] * 10
    losses = [1.0, 1.2, 0.8, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 3.0]
    assert window_deviations(losses, ref, 5) == pytest.approx([0.08, 0.4])
    assert window_envelope(ref, [losses, ref], 5) == pytest.approx([0.08, 0.4])
    assert window_envelope(ref, [], 5) == [0.0, 0.0]


def test_a_drift_inside_the_envelope_passes() -> None:
    ref = reference()
    runs = perturbed(ref)
    # The size of the noise, all in one direction: a systematic, rounding-sized drift.
    drift = [r + 0.9 * abs(n) for r, n in zip(ref, noise(99), strict=True)]
    verdict = judge(drift, ref, runs)
    assert verdict.passed, verdict.reason
    assert 0 < verdict.window_ratio <= 1 / MULTIPLE
    assert verdict.window_ratio <= verdict.ratio <= 1
    assert verdict.envelope > verdict.floor  # judged against the envelope, not the floor
    assert re.fullmatch(
        r"deviation from the reference \S+ within 3x the envelope \S+ "
        r"\(steps 15-19\), drift \S+ within 3x the (envelope|floor) \S+",
        verdict.reason,
    )


def test_a_one_sided_drift_beyond_the_noise_fails_on_drift_alone() -> None:
    ref = reference()
    runs = [[r + n for r, n in zip(ref, noise(seed, scale=1e-5), strict=True)] for seed in range(4)]
    # Twice the noise, always upwards: inside 3x the windows' envelope, but rounding noise
    # changes sign and averages out over the trajectory, and this does not (a wrong op).
    biased = [r + 2 * abs(n) for r, n in zip(ref, noise(99, scale=1e-5), strict=True)]
    verdict = judge(biased, ref, runs)
    assert verdict.window_ratio <= 1 and verdict.drift_ratio > 1
    assert not verdict.passed and verdict.ratio == verdict.drift_ratio
    assert verdict.reason.startswith("drift ") and " exceeds 3x " in verdict.reason
    assert verdict.drift_envelope < verdict.drift  # the noise's own drift is small
    lenient = judge(biased, ref, runs, check_drift=False)
    assert lenient.passed and lenient.ratio == lenient.window_ratio
    assert lenient.reason.endswith("(not enforced)")


def test_a_step_change_outside_the_envelope_fails_in_its_window() -> None:
    ref = reference()
    changed = [r + (0.01 if t >= 12 else 0.0) for t, r in enumerate(ref)]
    verdict = judge(changed, ref, perturbed(ref))
    assert not verdict.passed
    assert verdict.ratio > 10
    assert verdict.decisive_steps[0] >= 10  # the windows before the change were fine
    assert verdict.window_deviations[0] == 0.0
    assert "exceeds 3x the envelope" in verdict.reason
    assert f"steps {verdict.decisive_steps[0]}-{verdict.decisive_steps[1] - 1}" in verdict.reason


def test_an_error_alternating_in_sign_does_not_cancel_out() -> None:
    ref = reference()
    alternating = [r + 0.01 * (-1) ** t for t, r in enumerate(ref)]
    assert not judge(alternating, ref, perturbed(ref)).passed


def test_losses_approaching_zero_do_not_blow_up() -> None:
    ref = [2.0 * math.exp(-t) for t in range(STEPS)]  # down to 1e-8
    runs = [[r * (1 + 1e-7 * (-1) ** (t + k)) for t, r in enumerate(ref)] for k in range(4)]
    # Rounding-sized absolute differences late on are huge relative to a loss near zero.
    close = [r + (1e-9 if t > 15 else 0.0) for t, r in enumerate(ref)]
    verdict = judge(close, ref, runs)
    assert verdict.passed and math.isfinite(verdict.ratio)
    assert not compare(close, ref, exact=False, tolerance=GRAPH_RTOL).passed  # the old rule
    # And a real deviation there is still a deviation, in absolute terms.
    off = [r + (1e-3 if t > 15 else 0.0) for t, r in enumerate(ref)]
    assert not judge(off, ref, runs).passed


def test_the_floor_keeps_a_zero_envelope_from_rejecting_rounding() -> None:
    ref = reference()
    stable = [list(ref) for _ in range(4)]  # every perturbed run reproduced the reference
    assert window_envelope(ref, stable) == [0.0] * 4
    floor = loss_floor(ref)
    assert floor == pytest.approx(FLOOR_ULPS * FLOAT32_EPS * 2.3)
    two_ulps = [r + 2 * FLOAT32_EPS * abs(r) for r in ref]
    verdict = judge(two_ulps, ref, stable)
    assert verdict.passed and verdict.envelope == 0.0 and verdict.floor == floor
    assert verdict.bound == pytest.approx(MULTIPLE * floor)
    assert "the floor" in verdict.reason
    assert not judge([r + 1e-3 for r in ref], ref, stable).passed
    assert judge(ref, ref, stable).ratio == 0.0


@pytest.mark.parametrize("where", ["losses", "reference"])
def test_a_non_finite_loss_fails(where: str) -> None:
    ref = reference()
    broken = list(ref)
    broken[7] = math.nan
    losses, against = (broken, ref) if where == "losses" else (ref, broken)
    verdict = judge(losses, against, perturbed(ref))
    assert not verdict.passed
    assert verdict.first_nonfinite_step == 7 and verdict.decisive_steps == (5, 10)
    assert "not finite at step 7" in verdict.reason
    inf = list(ref)
    inf[0] = math.inf
    assert not judge(inf, ref, perturbed(ref)).passed


def test_a_length_mismatch_fails() -> None:
    ref = reference()
    verdict = judge(ref[:-1], ref, perturbed(ref))
    assert not verdict.passed and verdict.ratio == math.inf
    assert "19 losses against 20" in verdict.reason
    assert not judge([], [], []).passed


def test_the_multiple_scales_the_bound() -> None:
    ref = reference()
    runs = perturbed(ref)
    shifted = [r + 4e-6 * 1.15**t for t, r in enumerate(ref)]
    strict, lenient = (
        judge(shifted, ref, runs, multiple=1.0),
        judge(shifted, ref, runs, multiple=10.0),
    )
    assert strict.ratio == pytest.approx(10 * lenient.ratio)
    assert not strict.passed and lenient.passed
    with pytest.raises(ValueError, match="multiple"):
        judge(ref, ref, runs, multiple=0)


def test_the_outcome_serialises() -> None:
    ref = reference()
    values = json.loads(json.dumps(judge(ref, ref, perturbed(ref)).to_dict()))
    assert values["passed"] is True and values["window"] == 5 and values["multiple"] == MULTIPLE
    assert len(values["window_deviations"]) == len(values["window_envelopes"]) == 4
