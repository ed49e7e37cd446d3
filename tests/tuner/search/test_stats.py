from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from tuner.search.measuring.stats import (
    Decision,
    Measurement,
    bootstrap_ci,
    decide,
    drift,
    fastest_under,
    pareto_front,
    ratio_ci,
)


def _normal(mean: float, sd: float, n: int, seed: int) -> list[float]:
    return [float(x) for x in np.random.default_rng(seed).normal(mean, sd, n)]


def _m(
    name: str,
    center: float,
    *,
    spread: float = 1.0,
    key: tuple[int, ...] = (),
    memory: int | None = None,
) -> Measurement:
    """Measurement with samples evenly spread over [center - spread, center + spread]."""
    samples = tuple(np.linspace(center - spread, center + spread, 9).tolist())
    return Measurement(name=name, samples=samples, key=key, memory_bytes=memory)


# ----------------------------------------------------------------------------- bootstrap_ci


def test_bootstrap_ci_contains_median_and_narrows_with_more_samples() -> None:
    small = _normal(100.0, 5.0, 20, seed=1)
    large = _normal(100.0, 5.0, 400, seed=2)
    lo_s, hi_s = bootstrap_ci(small, n_resamples=500)
    lo_l, hi_l = bootstrap_ci(large, n_resamples=500)
    assert lo_s <= float(np.median(small)) <= hi_s
    assert lo_l <= float(np.median(large)) <= hi_l
    assert lo_l <= 100.0 <= hi_l
    assert (hi_l - lo_l) < 0.5 * (hi_s - lo_s)


def test_bootstrap_ci_is_reproducible_and_seed_dependent() -> None:
    data = _normal(50.0, 3.0, 15, seed=3)
    assert bootstrap_ci(data, n_resamples=300, seed=7) == bootstrap_ci(
        data, n_resamples=300, seed=7
    )
    # percentile bounds of a median land on data points, so two seeds may agree by chance
    assert len({bootstrap_ci(data, n_resamples=300, seed=s) for s in range(6)}) > 1


def test_bootstrap_ci_higher_confidence_is_wider() -> None:
    data = _normal(10.0, 1.0, 60, seed=4)
    lo80, hi80 = bootstrap_ci(data, confidence=0.80, n_resamples=1000)
    lo99, hi99 = bootstrap_ci(data, confidence=0.99, n_resamples=1000)
    assert lo99 <= lo80 and hi80 <= hi99
    assert (hi99 - lo99) > (hi80 - lo80)


@pytest.mark.parametrize(
    ("samples", "expected"),
    [([5.0, 5.0, 5.0], (5.0, 5.0)), ([7.5], (7.5, 7.5)), ((3, 3), (3.0, 3.0))],
)
def test_bootstrap_ci_degenerate(samples: list[float], expected: tuple[float, float]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert bootstrap_ci(samples) == expected


def test_bootstrap_ci_never_nan_for_two_values() -> None:
    lo, hi = bootstrap_ci([1.0, 2.0], n_resamples=200)
    assert not math.isnan(lo) and not math.isnan(hi)
    assert 1.0 <= lo <= hi <= 2.0


@pytest.mark.parametrize(
    ("kwargs", "argument"),
    [
        ({"samples": []}, "samples"),
        ({"samples": [1.0, float("nan")]}, "samples"),
        ({"samples": [1.0, 2.0], "confidence": 1.0}, "confidence"),
        ({"samples": [1.0, 2.0], "confidence": 0.0}, "confidence"),
        ({"samples": [1.0, 2.0], "n_resamples": 0}, "n_resamples"),
    ],
)
def test_bootstrap_ci_errors_name_the_argument(kwargs: dict[str, object], argument: str) -> None:
    samples = kwargs.pop("samples")
    with pytest.raises(ValueError, match=argument):
        bootstrap_ci(samples, **kwargs)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- ratio_ci


def test_ratio_ci_detects_a_2x_speedup() -> None:
    fast = _normal(200.0, 4.0, 30, seed=10)
    base = _normal(100.0, 2.0, 30, seed=11)
    ratio, lo, hi = ratio_ci(fast, base, n_resamples=1000)
    assert ratio == pytest.approx(float(np.median(fast)) / float(np.median(base)))
    assert ratio == pytest.approx(2.0, rel=0.05)
    assert lo <= ratio <= hi
    assert lo <= 2.0 <= hi
    assert lo > 1.0


def test_ratio_ci_no_speedup_contains_one() -> None:
    a = _normal(100.0, 5.0, 25, seed=12)
    b = _normal(100.0, 5.0, 25, seed=13)
    _, lo, hi = ratio_ci(a, b, n_resamples=1000)
    assert lo <= 1.0 <= hi


def test_ratio_ci_degenerate_inputs() -> None:
    assert ratio_ci([6.0, 6.0, 6.0], [3.0, 3.0]) == (2.0, 2.0, 2.0)
    assert ratio_ci([6.0], [2.0]) == (3.0, 3.0, 3.0)
    # one side constant: the CI comes from the other side only and is finite
    ratio, lo, hi = ratio_ci([10.0, 12.0, 14.0, 16.0], [2.0], n_resamples=300)
    assert ratio == pytest.approx(6.5)
    assert 5.0 <= lo <= ratio <= hi <= 8.0
    ratio, lo, hi = ratio_ci([12.0], [2.0, 3.0, 4.0], n_resamples=300)
    assert ratio == pytest.approx(4.0)
    assert 3.0 <= lo <= ratio <= hi <= 6.0


def test_ratio_ci_errors_name_the_argument() -> None:
    with pytest.raises(ValueError, match="numerator"):
        ratio_ci([], [1.0])
    with pytest.raises(ValueError, match="denominator"):
        ratio_ci([1.0], [])
    with pytest.raises(ValueError, match="denominator"):
        ratio_ci([1.0, 2.0], [1.0, 0.0])
    with pytest.raises(ValueError, match="n_resamples"):
        ratio_ci([1.0, 2.0], [1.0, 2.0], n_resamples=-5)


# ----------------------------------------------------------------------------- Measurement


def test_measurement_computes_median_and_ci() -> None:
    m = Measurement(name="a", samples=[1, 2, 3, 4, 100])  # type: ignore[arg-type]
    assert m.samples == (1.0, 2.0, 3.0, 4.0, 100.0)
    assert m.median == 3.0
    lo, hi = m.ci95
    assert lo <= 3.0 <= hi
    assert m.ci95 == bootstrap_ci(m.samples)
    assert Measurement(name="c", samples=(4.0, 4.0)).ci95 == (4.0, 4.0)


def test_measurement_is_frozen_and_validates() -> None:
    m = Measurement(name="a", samples=(1.0, 2.0))
    with pytest.raises(AttributeError):
        m.name = "b"  # type: ignore[misc]
    with pytest.raises(ValueError, match="samples"):
        Measurement(name="a", samples=())
    with pytest.raises(ValueError, match="memory_bytes"):
        Measurement(name="a", samples=(1.0,), memory_bytes=-1)


# ----------------------------------------------------------------------------- decide


def test_decide_picks_simpler_of_two_overlapping() -> None:
    simple = _m("simple", 99.5, key=(1, 0))
    complex_fast = _m("complex_fast", 100.0, key=(4, 1))
    slow = _m("slow", 50.0, key=(0, 0))  # simplest of all, but clearly slower
    decision = decide([slow, complex_fast, simple], order_description="(num_streams, cuda_graph)")
    assert isinstance(decision, Decision)
    assert decision.fastest is complex_fast
    assert decision.best is simple
    assert decision.was_tie is True
    assert {m.name for m in decision.ties} == {"simple", "complex_fast"}
    assert "2 configs tie" in decision.reason
    assert "(num_streams, cuda_graph)" in decision.reason
    assert decision.reason.endswith("wins: simple")


def test_decide_separated_picks_fastest_even_if_complex() -> None:
    simple = _m("simple", 100.0, key=(1,))
    complex_fast = _m("complex_fast", 150.0, key=(9,))
    decision = decide([simple, complex_fast])
    assert decision.best is complex_fast
    assert decision.fastest is complex_fast
    assert decision.ties == (complex_fast,)
    assert decision.was_tie is False
    assert "complex_fast" in decision.reason


def test_decide_equal_keys_prefer_higher_median() -> None:
    a = _m("a", 99.8, key=(1,))
    b = _m("b", 100.0, key=(1,))
    decision = decide([a, b])
    assert decision.was_tie
    assert decision.best is b


def test_decide_keeps_a_tie_only_where_it_beats_what_the_fastest_beat() -> None:
    """A wide interval tied with the fastest and with the PyTorch default had won as the
    simpler, though it was no measured gain on the default (a probe's CPU run, 2026-12-06)."""
    default = Measurement(name="default", samples=(670.0, 677.0, 684.0, 677.0), key=(0,))
    fastest = Measurement(name="fastest", samples=(725.0, 735.0, 745.0, 735.0), key=(9,))
    wide = Measurement(name="wide", samples=(631.0, 711.0, 791.0, 711.0), key=(1,))
    assert wide.ci95[0] <= default.ci95[1] and wide.ci95[1] >= fastest.ci95[0]  # tied with both
    decision = decide([default, fastest, wide])
    assert decision.best is fastest and decision.ties == (fastest,) and not decision.was_tie
    # Narrow enough to clear the default, it is a tie again and wins as the simpler.
    narrow = Measurement(name="narrow", samples=(715.0, 725.0, 735.0, 725.0), key=(1,))
    decision = decide([default, fastest, narrow])
    assert decision.best is narrow and decision.was_tie


def test_decide_single_and_empty() -> None:
    only = _m("only", 10.0)
    decision = decide([only])
    assert decision.best is only and decision.ties == (only,) and not decision.was_tie
    with pytest.raises(ValueError, match="measurements"):
        decide([])


def test_decide_touching_intervals_count_as_overlap() -> None:
    # constant samples -> point CIs; equal points overlap (a <= d and c <= b)
    a = Measurement(name="a", samples=(10.0, 10.0), key=(2,))
    b = Measurement(name="b", samples=(10.0,), key=(1,))
    c = Measurement(name="c", samples=(9.999,), key=(0,))
    decision = decide([a, b, c])
    assert [m.name for m in decision.ties] == ["a", "b"]
    assert decision.best is b


# ----------------------------------------------------------------------------- pareto_front


def test_pareto_front_hand_built() -> None:
    ms = [
        _m("small_slow", 50.0, memory=100),
        _m("mid", 80.0, memory=200),
        _m("dominated_mid", 70.0, memory=250),  # mid is faster and smaller
        _m("big_fast", 100.0, memory=400),
        _m("same_mem_slower", 90.0, memory=400),  # equal memory, slower than big_fast
        _m("huge_slower", 95.0, memory=800),  # big_fast is faster and smaller
        _m("unknown_mem", 500.0, memory=None),  # excluded
    ]
    front = pareto_front(ms)
    assert [m.name for m in front] == ["small_slow", "mid", "big_fast"]


def test_pareto_front_empty_and_all_unknown() -> None:
    assert pareto_front([]) == []
    assert pareto_front([_m("x", 1.0)]) == []


# ----------------------------------------------------------------------------- fastest_under


def test_fastest_under_respects_cap() -> None:
    ms = [
        _m("a", 50.0, memory=100),
        _m("b", 80.0, memory=200),
        _m("c", 100.0, memory=400),
        _m("d", 999.0, memory=None),
    ]
    assert fastest_under(ms, 1000).name == "c"  # type: ignore[union-attr]
    assert fastest_under(ms, 399).name == "b"  # type: ignore[union-attr]
    assert fastest_under(ms, 200).name == "b"  # type: ignore[union-attr]  # cap is inclusive
    assert fastest_under(ms, 100).name == "a"  # type: ignore[union-attr]
    assert fastest_under(ms, 99) is None
    assert fastest_under([], 10**12) is None
    with pytest.raises(ValueError, match="max_memory_bytes"):
        fastest_under(ms, -1)


# ----------------------------------------------------------------------------- drift


def test_drift() -> None:
    assert drift([100.0, 100.0, 100.0], [110.0, 110.0]) == pytest.approx(0.10)
    assert drift([100.0, 90.0, 110.0], [95.0]) == pytest.approx(-0.05)
    assert drift([3.0], [3.0]) == 0.0
    with pytest.raises(ValueError, match="before"):
        drift([], [1.0])
    with pytest.raises(ValueError, match="after"):
        drift([1.0], [])
    with pytest.raises(ValueError, match="before"):
        drift([-1.0, 0.0, 1.0], [1.0])


def test_decide_margin_ties_practically_equal_configs() -> None:
    # Two tight, non-overlapping intervals 0.2 % apart: separate by CI, tied within a 1 % margin.
    fast = Measurement(name="graph", samples=(368.4, 368.5, 368.6, 368.5), key=(3, 1))
    simple = Measurement(name="eager", samples=(367.7, 367.8, 367.7, 367.8), key=(3, 0))
    slow = Measurement(name="default", samples=(361.0, 361.5, 361.7, 361.2), key=(1, 0))
    strict = decide([fast, simple, slow])
    assert strict.best.name == "graph" and not strict.was_tie
    loose = decide([fast, simple, slow], margin=0.01)
    assert loose.best.name == "eager" and loose.was_tie
    assert {m.name for m in loose.ties} == {"graph", "eager"}  # default is 1.9 % slower
    assert "within 1.0%" in loose.reason


def test_decide_margin_must_be_a_fraction() -> None:
    m = Measurement(name="a", samples=(1.0, 2.0))
    with pytest.raises(ValueError, match="margin"):
        decide([m], margin=1.5)
