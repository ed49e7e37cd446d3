"""The statistical half of the correctness gate: is a loss trajectory inside the noise envelope?

Where a config may legitimately change the arithmetic (a capturable, fused or foreach optimizer,
compiled kernels), its losses are not owed bit for bit; they are owed *as close to the reference
as runs that differ from it only by rounding*. Those runs are the reference trained again from
weights perturbed in their last bit (`trainers.gate.envelope`). The statistic, in full:

- Windows: the T steps are split into n = max(1, T // W) consecutive windows of nearly equal
  length (W = `WINDOW` = 5 steps by default; a remainder goes to the first windows).
- Deviation of a trajectory x from the reference r in window j: the mean absolute difference
  D_j(x) = mean over t in window j of |x_t - r_t|. Absolute, in the loss's own units: nothing
  is divided by the loss, so a loss falling towards zero cannot make it blow up. Averaging over a
  window (instead of one step's error) keeps one step's rounding flip from deciding; the
  absolute value (instead of a signed mean) keeps a fault whose error alternates in sign from
  cancelling out.
- Envelope of window j: E_j = max over the K perturbed runs p_k of D_j(p_k). Per window, because
  training amplifies differences: the spread grows with the step.
- Floor: F = FLOOR_ULPS (16) float32 ulps of the loss's scale, 16 * 2^-23 * max_t |r_t|. A very
  stable workload can give E_j = 0 (every perturbed run reproduces the reference's losses); a
  different summation order can still move a loss value by a few ulps. F is scaled by the
  largest reference loss, not the current one, so it does not shrink to zero with the loss.
- Bound of window j: B_j = m * max(E_j, F) with m = `MULTIPLE` = 3.
- Drift: D* = |mean over all T steps of (x_t - r_t)|, the signed deviation averaged over the
  whole trajectory; its envelope E* = max over k of D*(p_k); its bound B* = m * max(E*, F).
  Rounding noise changes sign from step to step and from run to run, so it averages out; a
  wrong op (a scaled update, a stale batch) pushes the loss one way, so it does not. The drift
  is what catches a small systematic error hiding inside a chaotic workload's envelope.
- The config passes when D_j(config) <= B_j in every window and D*(config) <= B*; `ratio` =
  max(max_j D_j / B_j, D* / B*) (<= 1 passes). Any non-finite loss fails; so does a trajectory
  of another length.

Why m = 3: a perturbation is applied once, at step 0; a different optimizer or kernel rounds
differently at every step, so its deviation may exceed a one-off perturbation's by a small
factor, and the largest of K = 4 runs underestimates the upper tail of the spread. Why a floor of
16 ulps: a stable workload's envelope can be 0-2 ulps of the loss.

Measured on a CPU (torch 2.13, 20 steps; ratios are D / B, so > 1 rejects):
- mlp, transformer, convnet tiny (8 seeds each) and mlp small (3): envelopes 0-5e-7, below the
  floor, so the floor decides. Fused Adam <= 0.011, foreach Adam 0, one perturbed run against
  four others <= 0.36; learning rate x 0.99: 22-147, x 0.999: 2.2-24, x 0.9999: passed.
- transformer small (3 seeds, 6 perturbations; chaotic: the envelope reaches 1e-4 to 3e-4 by
  step 6): windows alone caught learning rate x 0.99 in 1 of 3 seeds (0.66-1.45); the drift
  caught it in 3 of 3 (1.6-3.0) and x 0.995 in 2 of 3, while rounding-only runs (each perturbed
  run against four others: 18) scored <= 0.50 on windows and <= 0.49 on drift, and fused Adam
  <= 0.27 and <= 0.21.
On a GPU, with larger models and TF32 or bf16, the envelope is expected to decide more often;
that is unmeasured here, and a legitimate change with a systematic bias (a lower-precision
accumulation that rounds one way) would show in the drift first. `multiple` and `check_drift`
are parameters of `judge`, and `benchmarks/gate_power.py` reports every ratio of both tests
(and the leave-one-out ratios of the perturbed runs), so m, the floor and the drift test can
be checked on the GPU they are used on.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from trainers.measure import window_sizes

WINDOW = 5
"""Steps per window of the statistic (see the module docstring)."""
MULTIPLE = 3.0
"""A config's windowed deviation may be at most this many times the envelope (or the floor)."""
FLOOR_ULPS = 16
"""The floor of the envelope in float32 ulps of the largest reference loss."""
FLOAT32_EPS = 2.0**-23


def window_spans(steps: int, window: int = WINDOW) -> list[tuple[int, int]]:
    """[first, last) step of each window: max(1, steps // window) windows of nearly equal size."""
    if window < 1:
        raise ValueError(f"window={window!r} is invalid: allowed an integer >= 1")
    if steps < 1:
        return []
    spans = []
    first = 0
    for size in window_sizes(steps, max(1, steps // window)):
        spans.append((first, first + size))
        first += size
    return spans


def window_deviations(
    losses: Sequence[float], reference: Sequence[float], window: int = WINDOW
) -> list[float]:
    """D_j: the mean absolute difference from the reference in each window (inf if a loss of
    the window is not finite). The trajectories must have the same length."""
    if len(losses) != len(reference):
        raise ValueError(f"{len(losses)} losses against {len(reference)} in the reference")
    deviations = []
    for first, last in window_spans(len(reference), window):
        diffs = [abs(a - b) for a, b in zip(losses[first:last], reference[first:last], strict=True)]
        deviations.append(
            math.fsum(diffs) / len(diffs) if all(map(math.isfinite, diffs)) else math.inf
        )
    return deviations


def window_envelope(
    reference: Sequence[float], perturbed: Sequence[Sequence[float]], window: int = WINDOW
) -> list[float]:
    """E_j: the largest windowed deviation of the perturbed runs (zeros without any)."""
    envelope = [0.0] * len(window_spans(len(reference), window))
    for run in perturbed:
        envelope = [
            max(e, d)
            for e, d in zip(envelope, window_deviations(run, reference, window), strict=True)
        ]
    return envelope


def loss_floor(reference: Sequence[float], ulps: float = FLOOR_ULPS) -> float:
    """F: `ulps` float32 ulps of the largest finite reference loss."""
    scale = max((abs(x) for x in reference if math.isfinite(x)), default=0.0)
    return ulps * FLOAT32_EPS * scale


def drift(losses: Sequence[float], reference: Sequence[float]) -> float:
    """D*: |mean over all steps of (x_t - r_t)|, the signed deviation averaged over the whole
    trajectory (inf if a loss is not finite)."""
    if len(losses) != len(reference):
        raise ValueError(f"{len(losses)} losses against {len(reference)} in the reference")
    diffs = [a - b for a, b in zip(losses, reference, strict=True)]
    if not diffs or not all(map(math.isfinite, diffs)):
        return math.inf if diffs else 0.0
    return abs(math.fsum(diffs) / len(diffs))


@dataclasses.dataclass(kw_only=True, frozen=True)
class Equivalence:
    """The equivalence test's outcome. `deviation`, `envelope` and `bound` are those of the
    decisive window (the largest D_j / B_j; steps `decisive_steps`, first included, last not);
    the per-window lists hold all of them. The drift figures are the whole-trajectory test."""

    passed: bool
    ratio: float
    """The score: the larger of `window_ratio` and (when enforced) `drift_ratio`; <= 1 passes."""
    window_ratio: float
    deviation: float
    envelope: float
    floor: float
    bound: float
    multiple: float
    window: int
    decisive_window: int
    decisive_steps: tuple[int, int]
    window_deviations: tuple[float, ...]
    window_envelopes: tuple[float, ...]
    drift: float
    drift_envelope: float
    drift_bound: float
    drift_ratio: float
    drift_enforced: bool
    first_nonfinite_step: int | None
    reason: str

    @property
    def passing_multiple(self) -> float | None:
        """The least `multiple` these losses would pass at (every bound scales with it), None
        where none would (a loss that is not finite). Where a user sets the multiple (a config in
        another precision, `--precision-tolerance`), it is the tolerance a rejection asks for."""
        return self.ratio * self.multiple if math.isfinite(self.ratio) else None

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        for key in ("decisive_steps", "window_deviations", "window_envelopes"):
            values[key] = list(values[key])
        return values


def _failed(
    reason: str,
    *,
    steps: tuple[int, int],
    window_index: int,
    nonfinite: int | None,
    common: dict[str, Any],
) -> Equivalence:
    return Equivalence(
        passed=False,
        ratio=math.inf,
        window_ratio=math.inf,
        deviation=math.inf,
        envelope=math.nan,
        bound=math.nan,
        decisive_window=window_index,
        decisive_steps=steps,
        window_deviations=(),
        window_envelopes=(),
        drift=math.inf,
        drift_envelope=math.nan,
        drift_bound=math.nan,
        drift_ratio=math.inf,
        first_nonfinite_step=nonfinite,
        reason=reason,
        **common,
    )


def _ratio(value: float, bound: float) -> float:
    return value / bound if bound > 0 else (0.0 if value == 0 else math.inf)


def _unusable(
    losses: Sequence[float], reference: Sequence[float], window: int, common: dict[str, Any]
) -> Equivalence | None:
    """The failed verdict for trajectories that cannot be compared (lengths differ, a loss is
    not finite), or None."""
    if len(losses) != len(reference) or not reference:
        return _failed(
            f"{len(losses)} losses against {len(reference)} in the reference",
            steps=(0, len(reference)),
            window_index=0,
            nonfinite=None,
            common=common,
        )
    spans = window_spans(len(reference), window)
    for name, run in (("the reference's loss", reference), ("loss", losses)):
        bad = next((t for t, x in enumerate(run) if not math.isfinite(x)), None)
        if bad is not None:
            index = next(j for j, (a, b) in enumerate(spans) if a <= bad < b)
            return _failed(
                f"{name} is not finite at step {bad}",
                steps=spans[index],
                window_index=index,
                nonfinite=bad,
                common=common,
            )
    return None


def _drift_test(
    losses: Sequence[float],
    reference: Sequence[float],
    perturbed: Sequence[Sequence[float]],
    *,
    multiple: float,
    floor: float,
) -> tuple[float, float, float, float]:
    """The drift over the whole trajectory: the config's, the envelope's (the largest of the
    perturbed runs'), its bound and their ratio."""
    drift_value = drift(losses, reference)
    drift_env = max((drift(run, reference) for run in perturbed), default=0.0)
    drift_bound = multiple * max(drift_env, floor)
    return drift_value, drift_env, drift_bound, _ratio(drift_value, drift_bound)


def _window_text(
    deviation: float,
    envelope: float,
    steps: tuple[int, int],
    *,
    ok: bool,
    multiple: float,
    floor: float,
) -> str:
    """The decisive window's part of the reason."""
    first, last = steps
    return (
        f"deviation from the reference {deviation:.2g} "
        f"{'within' if ok else 'exceeds'} {multiple:g}x "
        f"{'the envelope' if envelope >= floor else 'the floor'} "
        f"{max(envelope, floor):.2g} (steps {first}-{last - 1})"
    )


def _drift_text(
    value: float,
    envelope: float,
    ratio: float,
    *,
    multiple: float,
    floor: float,
    enforced: bool,
) -> str:
    """The drift's part of the reason (said even where it is not enforced)."""
    text = (
        f"drift {value:.2g} {'within' if ratio <= 1.0 else 'exceeds'} {multiple:g}x "
        f"{'the envelope' if envelope >= floor else 'the floor'} {max(envelope, floor):.2g}"
    )
    if not enforced:
        text += " (not enforced)"
    return text


def _reason(window_text: str, drift_text: str, *, window_ok: bool, drift_ok: bool) -> str:
    """The verdict's reason: the decisive window's test, and the drift's unless only the window
    fails."""
    parts = [window_text, drift_text] if window_ok or not drift_ok else [window_text]
    if window_ok and not drift_ok:
        parts.reverse()  # the failing test first
    return ", ".join(parts)


def judge(
    losses: Sequence[float],
    reference: Sequence[float],
    perturbed: Sequence[Sequence[float]],
    *,
    window: int = WINDOW,
    multiple: float = MULTIPLE,
    floor_ulps: float = FLOOR_ULPS,
    check_drift: bool = True,
) -> Equivalence:
    """Does `losses` stay within `multiple` x the envelope of `perturbed` around `reference`,
    window by window and (`check_drift`) in its drift over the whole trajectory?"""
    if multiple <= 0:
        raise ValueError(f"multiple={multiple!r} is invalid: allowed a number > 0")
    floor = loss_floor(reference, floor_ulps)
    common: dict[str, Any] = {"floor": floor, "multiple": multiple, "window": window}
    common["drift_enforced"] = check_drift
    unusable = _unusable(losses, reference, window, common)
    if unusable is not None:
        return unusable
    spans = window_spans(len(reference), window)
    deviations = window_deviations(losses, reference, window)
    envelopes = window_envelope(reference, perturbed, window)
    bounds = [multiple * max(e, floor) for e in envelopes]
    ratios = [_ratio(d, b) for d, b in zip(deviations, bounds, strict=True)]
    j = max(range(len(ratios)), key=ratios.__getitem__)
    drift_value, drift_env, drift_bound, drift_ratio = _drift_test(
        losses, reference, perturbed, multiple=multiple, floor=floor
    )
    window_ok = ratios[j] <= 1.0
    drift_ok = drift_ratio <= 1.0 or not check_drift
    window_text = _window_text(
        deviations[j], envelopes[j], spans[j], ok=window_ok, multiple=multiple, floor=floor
    )
    drift_text = _drift_text(
        drift_value, drift_env, drift_ratio, multiple=multiple, floor=floor, enforced=check_drift
    )
    return Equivalence(
        passed=window_ok and drift_ok,
        ratio=max(ratios[j], drift_ratio) if check_drift else ratios[j],
        window_ratio=ratios[j],
        deviation=deviations[j],
        envelope=envelopes[j],
        bound=bounds[j],
        decisive_window=j,
        decisive_steps=spans[j],
        window_deviations=tuple(deviations),
        window_envelopes=tuple(envelopes),
        drift=drift_value,
        drift_envelope=drift_env,
        drift_bound=drift_bound,
        drift_ratio=drift_ratio,
        first_nonfinite_step=None,
        reason=_reason(window_text, drift_text, window_ok=window_ok, drift_ok=drift_ok),
        **common,
    )
