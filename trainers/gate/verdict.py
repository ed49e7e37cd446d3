"""The gate's verdict (`ParityVerdict`), the tests it names (`GateTest`), and the step-by-step
comparison of two loss trajectories (`compare`) that every exact test makes.

`trainers.gate.parity` decides which tests a config is owed and reaches the verdict; this module
only says what a verdict holds and how two trajectories compare.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

from trainers.gate.equivalence import Equivalence

__all__ = [
    "GATE_TESTS",
    "GRAPH_RTOL",
    "GateTest",
    "ParityVerdict",
    "compare",
    "equivalence_fields",
    "first_difference",
    "per_step",
]

GRAPH_RTOL = 1e-3
"""Legacy: the relative per-step tolerance `compare(exact=False)` applies. `gate` no longer uses
it: a fixed relative tolerance rejected legitimate graph configs (a ResNet-18 at 0.198) and blows
up as the loss falls towards zero."""

GateTest = Literal["exact", "equivalence", "exact+equivalence"]
GATE_TESTS: tuple[str, ...] = get_args(GateTest)


@dataclasses.dataclass(kw_only=True, frozen=True)
class ParityVerdict:
    """The gate's verdict. The first eight fields keep their old meaning; the rest say which
    test applied and by how much it passed or failed.

    max_abs_deviation, max_rel_deviation, first_diverging_step: per step, against the reference.
    tolerance: 0 for an exact test alone; otherwise the equivalence bound of the decisive window.
    test: the tests that applied ("relative" for the legacy `compare(exact=False)`);
    exact_against: what the exact test compared with ("reference", "eager twin", or "loop twin":
    then the loop twin was compared with the reference, `trainers.gate.twin`; "eager twin's
    noise": the eager twin within its own run-to-run difference, `twin_noise`).
    exact_skipped: why an exact test the config needed could not apply (an eager step or an eager
    twin that is not bitwise reproducible here).
    eager_reproducible, eager_first_difference, eager_max_abs_difference: the reproducibility
    probe (`trainers.gate.reproducibility`; for a loop twin, in the reference's precision);
    None where no exact test was owed, or where the config replayed its eager twin (a loop twin
    the reference) bit for bit before the probe was known (it was not needed);
    for an exact test against the reference that matched, True from those two runs.
    graph_replays_twin, graph_first_difference: for a graph owed its twin's bits, the probe's
    one-stream graph against its eager twin (GPU only). determinism: the mode the config's own
    run computed under (`trainers.gate.parity.config_determinism`; its probe and twin ran
    strict); reference_determinism: the reference's and its
    envelope's (`SEEDS_DETERMINISM` against another precision; None in a verdict from before it
    was recorded). precision, reference_precision: what the config's runs and the reference (and
    its envelope) ran in. exact_steps: how many of the config's first steps the exact tests
    covered (None: no exact test was owed). passing_multiple: the least multiple of the envelope
    the equivalence test would pass at (None: no equivalence test, or a loss that is not
    finite).
    twin_max_abs_deviation, twin_first_diverging_step: the exact comparison with the eager twin
    (of a loop twin, of its losses with the reference's).
    twin_noise: where the config and its eager twin ran with the process's own kernels and the
    twin's two runs differed (`exact_against` "eager twin's noise"), the twin's own largest
    run-to-run difference, which the config was held within `TWIN_NOISE_MULTIPLE` times
    (`trainers.gate.exact`); None otherwise.
    deviation, envelope, floor, bound, multiple, window, ratio, window_ratio, decisive_steps,
    window_deviations, window_envelopes, drift, drift_envelope, drift_bound, drift_ratio: the
    equivalence test (`trainers.gate.equivalence.Equivalence`); ratio <= 1 passes it.
    losses: the config's loss trajectory.
    """

    passed: bool
    exact_required: bool
    tolerance: float
    steps: int
    max_abs_deviation: float
    max_rel_deviation: float
    first_diverging_step: int | None
    reason: str
    test: str = "exact"
    exact_against: str | None = None
    exact_skipped: str | None = None
    twin_max_abs_deviation: float | None = None
    twin_first_diverging_step: int | None = None
    twin_noise: float | None = None
    deviation: float | None = None
    envelope: float | None = None
    floor: float | None = None
    bound: float | None = None
    multiple: float | None = None
    window: int | None = None
    ratio: float | None = None
    window_ratio: float | None = None
    decisive_steps: tuple[int, int] | None = None
    window_deviations: tuple[float, ...] = ()
    window_envelopes: tuple[float, ...] = ()
    drift: float | None = None
    drift_envelope: float | None = None
    drift_bound: float | None = None
    drift_ratio: float | None = None
    losses: tuple[float, ...] = ()
    eager_reproducible: bool | None = None
    eager_first_difference: int | None = None
    eager_max_abs_difference: float | None = None
    graph_replays_twin: bool | None = None
    graph_first_difference: int | None = None
    determinism: str | None = None
    precision: str | None = None
    reference_precision: str | None = None
    reference_determinism: str | None = None
    exact_steps: int | None = None
    passing_multiple: float | None = None

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        for key in ("decisive_steps", "window_deviations", "window_envelopes", "losses"):
            if values[key] is not None:
                values[key] = list(values[key])
        return values

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> ParityVerdict:
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in values.items() if k in names}
        for key in ("decisive_steps", "window_deviations", "window_envelopes", "losses"):
            if fields.get(key) is not None:
                fields[key] = tuple(fields[key])
        return cls(**fields)


def first_difference(losses: Sequence[float], reference: Sequence[float]) -> int | None:
    """The first step at which `losses` differs from `reference` bit for bit (where one is
    shorter, its length), or None."""
    for step, (a, b) in enumerate(zip(losses, reference, strict=False)):
        # NaN != NaN: a non-finite loss counts as a difference.
        if a != b:
            return step
    return None if len(losses) == len(reference) else min(len(losses), len(reference))


def per_step(
    losses: Sequence[float], reference: Sequence[float]
) -> tuple[float, float, int | None]:
    """Largest absolute and relative per-step deviation and the first step that differs."""
    if len(losses) != len(reference):
        return math.inf, math.inf, None
    max_abs = max_rel = 0.0
    for a, b in zip(losses, reference, strict=True):
        if math.isfinite(a) and math.isfinite(b):
            deviation, relative = abs(a - b), abs(a - b) / max(abs(b), 1e-12)
        else:
            deviation = relative = math.inf
        max_abs, max_rel = max(max_abs, deviation), max(max_rel, relative)
    return max_abs, max_rel, first_difference(losses, reference)


def compare(
    losses: Sequence[float], reference: Sequence[float], *, exact: bool, tolerance: float
) -> ParityVerdict:
    """Compare two loss trajectories step by step: bit for bit (`exact`), or, legacy, within a
    relative `tolerance` per step (`tuner/search/gating/isolated.py` still uses that for graph
    configs; `gate` replaces it)."""
    if len(losses) != len(reference):
        return ParityVerdict(
            passed=False,
            exact_required=exact,
            tolerance=tolerance,
            steps=len(reference),
            max_abs_deviation=math.inf,
            max_rel_deviation=math.inf,
            first_diverging_step=None,
            reason=f"{len(losses)} losses against {len(reference)} in the reference",
            test="exact" if exact else "relative",
            exact_against="reference" if exact else None,
        )
    max_abs, max_rel, first = per_step(losses, reference)
    passed = first is None if exact else max_rel <= tolerance
    if passed:
        reason = "identical losses" if max_abs == 0.0 else f"within {tolerance:g} relative"
    elif exact:
        reason = f"eager config must match bit for bit; first differs at step {first}"
    else:
        reason = f"relative deviation {max_rel:.3g} exceeds {tolerance:g}"
    return ParityVerdict(
        passed=passed,
        exact_required=exact,
        tolerance=0.0 if exact else tolerance,
        steps=len(reference),
        max_abs_deviation=max_abs,
        max_rel_deviation=max_rel,
        first_diverging_step=first,
        reason=reason,
        test="exact" if exact else "relative",
        exact_against="reference" if exact else None,
        losses=tuple(losses),
    )


def equivalence_fields(eq: Equivalence) -> dict[str, Any]:
    """The verdict's fields of the equivalence test."""
    return {
        "deviation": eq.deviation,
        "envelope": eq.envelope,
        "floor": eq.floor,
        "bound": eq.bound,
        "multiple": eq.multiple,
        "window": eq.window,
        "ratio": eq.ratio,
        "window_ratio": eq.window_ratio,
        "decisive_steps": eq.decisive_steps,
        "window_deviations": eq.window_deviations,
        "window_envelopes": eq.window_envelopes,
        "drift": eq.drift,
        "drift_envelope": eq.drift_envelope,
        "drift_bound": eq.drift_bound,
        "drift_ratio": eq.drift_ratio,
        "passing_multiple": eq.passing_multiple,
    }


def with_workers_hint(verdict: ParityVerdict, workers: int) -> str:
    """The verdict's reason, and where an eager config with `workers` DataLoader workers differs
    from its first step, the likely cause: each worker process draws its own random numbers, so
    a dataset that draws in `__getitem__` (an augmentation) gives other batches than in the main
    process; every config with workers failed so, and nothing said why (a new user's trial,
    2026-12-02). Where the second step is the first to differ: a stream copied into each."""
    if verdict.passed or workers == 0:
        return verdict.reason
    if verdict.first_diverging_step == 1:
        # The first batch equal, the second not: each worker gave the same first batch.
        return (
            f"{verdict.reason}: with {workers} DataLoader workers the second batch "
            "repeats the first; an IterableDataset is copied whole into each worker, which "
            "yields every item, unless it shards by torch.utils.data.get_worker_info()"
        )
    if verdict.first_diverging_step != 0:
        return verdict.reason
    # A collate_fn runs in the workers too, and has no index to seed from (an MLM's masking:
    # a user's probe, 2026-12-07): its draws go where they can be seeded.
    return (
        f"{verdict.reason}: with {workers} DataLoader workers the first batch already "
        "differs; data that draw random numbers in __getitem__ (an augmentation) or in a "
        "collate_fn (masking) draw them in each worker process otherwise than in the main one. "
        "Seed each draw in __getitem__ from the index (torch.Generator().manual_seed(seed + "
        "index)), move a collate_fn's draws there or into the loss (the main process), or pin "
        "num_workers=0, to make the data reproducible"
    )
