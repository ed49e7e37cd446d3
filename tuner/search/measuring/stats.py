"""Statistics the tuner decides with.

Everything here is pure numpy/scipy: bootstrap confidence intervals of medians and of speedup
ratios, a CI-overlap tie rule that prefers the simplest configuration among statistically
indistinguishable ones, a throughput/memory Pareto front and a baseline drift measure.

Throughput samples are "higher is better"; memory is "lower is better".
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from scipy import stats as _scipy_stats

__all__ = [
    "Decision",
    "Measurement",
    "bootstrap_ci",
    "decide",
    "drift",
    "fastest_under",
    "pareto_front",
    "ratio_ci",
]

_FloatArray = npt.NDArray[np.float64]


# --------------------------------------------------------------------------------------------
# argument checking
# --------------------------------------------------------------------------------------------


def _as_samples(name: str, values: Sequence[float]) -> _FloatArray:
    """Return ``values`` as a 1-D float array; raise ValueError if empty, not 1-D or not finite."""
    arr = np.asarray(values, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of numbers, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} must contain at least one sample, got an empty sequence")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must contain only finite numbers, got {list(values)!r}")
    return arr


def _check_bootstrap_args(confidence: float, n_resamples: int) -> None:
    """Raise ValueError unless 0 < confidence < 1 and n_resamples is a positive int."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be strictly between 0 and 1, got {confidence!r}")
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, int) or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive int, got {n_resamples!r}")


def _is_constant(arr: _FloatArray) -> bool:
    """True when resampling ``arr`` cannot change its median (one sample or all equal)."""
    return arr.size < 2 or bool(np.ptp(arr) == 0.0)


def _percentile_ci(
    data: tuple[_FloatArray, ...],
    statistic: Callable[..., Any],
    *,
    estimate: float,
    confidence: float,
    n_resamples: int,
    seed: int,
) -> tuple[float, float]:
    """Seeded percentile bootstrap CI; NaN bounds (degenerate resamples) fall back to estimate."""
    result = _scipy_stats.bootstrap(
        data,
        statistic,
        n_resamples=n_resamples,
        vectorized=True,
        paired=False,
        confidence_level=confidence,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    low = float(result.confidence_interval.low)
    high = float(result.confidence_interval.high)
    low = estimate if math.isnan(low) else low
    high = estimate if math.isnan(high) else high
    return (min(low, high), max(low, high))


# --------------------------------------------------------------------------------------------
# confidence intervals
# --------------------------------------------------------------------------------------------


def _median_statistic(a: _FloatArray, axis: int = -1) -> _FloatArray:
    return np.median(a, axis=axis)


def bootstrap_ci(
    samples: Sequence[float],
    *,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval ``(low, high)`` of the median of ``samples``.

    Deterministic for a given ``seed``. With a single sample, or when all samples are equal,
    returns ``(x, x)``. Never returns NaN. Raises ValueError for empty or non-finite
    ``samples``, ``confidence`` outside (0, 1) or ``n_resamples`` < 1.
    """
    arr = _as_samples("samples", samples)
    _check_bootstrap_args(confidence, n_resamples)
    median = float(np.median(arr))
    if _is_constant(arr):
        return (median, median)
    return _percentile_ci(
        (arr,),
        _median_statistic,
        estimate=median,
        confidence=confidence,
        n_resamples=n_resamples,
        seed=seed,
    )


def ratio_ci(
    numerator: Sequence[float],
    denominator: Sequence[float],
    *,
    confidence: float = 0.95,
    n_resamples: int = 2000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Speedup ``median(numerator) / median(denominator)`` with a bootstrap CI.

    Returns ``(ratio, low, high)``. The two samples are independent (unpaired) and are
    resampled separately (percentile bootstrap, deterministic for a given ``seed``). A sample
    with one observation or all-equal observations is treated as a constant; if both are, the
    CI is ``(ratio, ratio)``. Never returns NaN. ``denominator`` samples must all be > 0 so every
    resampled median is positive. Raises ValueError for empty or non-finite samples, a
    non-positive denominator sample, ``confidence`` outside (0, 1) or ``n_resamples`` < 1.
    """
    num = _as_samples("numerator", numerator)
    den = _as_samples("denominator", denominator)
    if np.any(den <= 0.0):
        raise ValueError(f"denominator must contain only samples > 0, got {list(denominator)!r}")
    _check_bootstrap_args(confidence, n_resamples)
    num_median = float(np.median(num))
    den_median = float(np.median(den))
    ratio = num_median / den_median
    ci_kwargs: dict[str, Any] = {
        "estimate": ratio,
        "confidence": confidence,
        "n_resamples": n_resamples,
        "seed": seed,
    }
    num_const, den_const = _is_constant(num), _is_constant(den)
    if num_const and den_const:
        return (ratio, ratio, ratio)
    if den_const:
        low, high = _percentile_ci(
            (num,), lambda a, axis=-1: np.median(a, axis=axis) / den_median, **ci_kwargs
        )
    elif num_const:
        low, high = _percentile_ci(
            (den,), lambda b, axis=-1: num_median / np.median(b, axis=axis), **ci_kwargs
        )
    else:
        low, high = _percentile_ci(
            (num, den),
            lambda a, b, axis=-1: np.median(a, axis=axis) / np.median(b, axis=axis),
            **ci_kwargs,
        )
    return (ratio, low, high)


def drift(before: Sequence[float], after: Sequence[float]) -> float:
    """Relative change of the median, ``(median(after) - median(before)) / median(before)``.

    Used to detect baseline drift between re-measurements: 0.05 means "5 % higher now".
    Raises ValueError for empty or non-finite samples or when ``median(before)`` is 0.
    """
    b = float(np.median(_as_samples("before", before)))
    a = float(np.median(_as_samples("after", after)))
    if b == 0.0:
        raise ValueError(f"before must have a non-zero median, got median {b!r}")
    return (a - b) / b


# --------------------------------------------------------------------------------------------
# measurements and decisions
# --------------------------------------------------------------------------------------------


@dataclasses.dataclass(kw_only=True, frozen=True)
class Measurement:
    """Throughput samples of one configuration.

    ``samples`` are throughputs (higher is better), stored as a tuple of floats. ``key`` is the
    simplicity key (smaller is simpler; keys of measurements compared together must be mutually
    orderable). ``median`` and ``ci95`` (95 % bootstrap CI of the median, default resampling,
    seed 0) are computed at construction. Raises ValueError for empty or non-finite samples
    or a negative ``memory_bytes``.
    """

    name: str
    samples: tuple[float, ...]
    memory_bytes: int | None = None
    key: tuple[Any, ...] = ()
    median: float = dataclasses.field(init=False)
    ci95: tuple[float, float] = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        arr = _as_samples("samples", self.samples)
        if self.memory_bytes is not None and self.memory_bytes < 0:
            raise ValueError(f"memory_bytes must be >= 0 or None, got {self.memory_bytes!r}")
        object.__setattr__(self, "samples", tuple(float(x) for x in arr))
        object.__setattr__(self, "key", tuple(self.key))
        object.__setattr__(self, "median", float(np.median(arr)))
        object.__setattr__(self, "ci95", bootstrap_ci(self.samples, confidence=0.95))


@dataclasses.dataclass(kw_only=True, frozen=True)
class Decision:
    """Outcome of :func:`decide`.

    ``best`` is the recommendation, ``fastest`` the highest median, ``ties`` every measurement
    whose ``ci95`` overlaps the fastest's (fastest included, in input order) and lies wholly
    above every config the fastest beat, ``was_tie`` is
    True when ``ties`` holds more than one measurement and ``reason`` explains the choice.
    """

    best: Measurement
    fastest: Measurement
    ties: tuple[Measurement, ...]
    was_tie: bool
    reason: str


def _overlaps(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Closed intervals [a0, a1] and [b0, b1] overlap iff a0 <= b1 and b0 <= a1."""
    return a[0] <= b[1] and b[0] <= a[1]


def decide(
    measurements: Sequence[Measurement],
    *,
    order_description: str = "simplicity key",
    margin: float = 0.0,
) -> Decision:
    """Pick the simplest configuration that is tied with the fastest.

    fastest = highest median (first one on equal medians). ties = all measurements whose
    ``ci95`` overlaps the fastest's ``ci95``, or whose median is within ``margin`` (a fraction)
    of the fastest's: on a GPU-bound step the intervals can be so tight that 0.2 % separates
    them, a difference no user should trade simplicity for; and whose ``ci95`` lies wholly
    above that of every measurement outside that set. best = smallest ``key`` among the
    ties, equal keys broken by the higher median. ``order_description`` names the key's
    ordering in ``reason``. Raises ValueError when ``measurements`` is empty or ``margin`` is
    outside [0, 1).
    """
    if len(measurements) == 0:
        raise ValueError(
            "measurements must contain at least one Measurement, got an empty sequence"
        )
    if not 0.0 <= margin < 1.0:
        raise ValueError(f"margin must be in [0, 1), got {margin!r}")
    fastest = max(measurements, key=lambda m: m.median)
    floor = fastest.median * (1.0 - margin)
    near = [
        m
        for m in measurements
        if _overlaps(m.ci95, fastest.ci95) or (margin > 0 and m.median >= floor)
    ]
    beaten = [m for m in measurements if all(m is not n for n in near)]
    # A tie stands in for the fastest only where it keeps the fastest's claims: measurably
    # faster than every config the fastest beat. Else a wide interval tied with both the fastest
    # and the PyTorch default won as the simpler, and was no gain on the default (a probe's CPU
    # run, 2026-12-06: 711 samples/s, 631-791, against 735 and the default's 677).
    ties = tuple(m for m in near if all(m.ci95[0] > b.ci95[1] for b in beaten))
    best = min(ties, key=lambda m: (m.key, -m.median))
    was_tie = len(ties) > 1
    if was_tie:
        within = f" or within {margin:.1%}" if margin > 0 else ""
        reason = (
            f"{len(ties)} configs tie with the fastest ({fastest.name}) (CI overlap{within}); "
            f"the simplest by {order_description} wins: {best.name}"
        )
    else:
        within = f" or comes within {margin:.1%} of it" if margin > 0 else ""
        reason = f"{fastest.name} is the fastest and no other config's CI overlaps it{within}"
    return Decision(best=best, fastest=fastest, ties=ties, was_tie=was_tie, reason=reason)


# --------------------------------------------------------------------------------------------
# memory trade-offs
# --------------------------------------------------------------------------------------------


def pareto_front(measurements: Sequence[Measurement]) -> list[Measurement]:
    """Measurements not dominated in (maximise median throughput, minimise memory_bytes).

    Measurements with ``memory_bytes`` None are excluded. ``p`` is dominated when another
    ``q`` has ``q.median >= p.median`` and ``q.memory_bytes <= p.memory_bytes`` with at least
    one strict (exact duplicates therefore both stay). Sorted by memory ascending, then by
    median descending.
    """
    known = [m for m in measurements if m.memory_bytes is not None]

    def dominated(p: Measurement) -> bool:
        assert p.memory_bytes is not None
        for q in known:
            assert q.memory_bytes is not None
            no_worse = q.median >= p.median and q.memory_bytes <= p.memory_bytes
            strictly = q.median > p.median or q.memory_bytes < p.memory_bytes
            if no_worse and strictly:
                return True
        return False

    front = [p for p in known if not dominated(p)]
    return sorted(front, key=lambda m: (m.memory_bytes, -m.median))


def fastest_under(measurements: Sequence[Measurement], max_memory_bytes: int) -> Measurement | None:
    """Highest-median measurement with known ``memory_bytes`` <= ``max_memory_bytes``.

    Returns None when none fits (measurements with ``memory_bytes`` None never fit). Raises
    ValueError when ``max_memory_bytes`` is negative.
    """
    if max_memory_bytes < 0:
        raise ValueError(f"max_memory_bytes must be >= 0, got {max_memory_bytes!r}")
    fitting = [
        m for m in measurements if m.memory_bytes is not None and m.memory_bytes <= max_memory_bytes
    ]
    if not fitting:
        return None
    return max(fitting, key=lambda m: m.median)
