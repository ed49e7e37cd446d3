"""The correctness gate: does a config train the same model as the reference loop?

What is owed depends on what the config changes:
- Loop settings (streams, sync interval and mode, prefetch, pinning, workers) only reorder when
  work is queued and when the host waits. They are owed the reference's losses bit for bit.
- A whole-step CUDA graph replays the kernels of one eager step, so it is owed bit for bit what
  the same step gives eagerly with the same optimizer implementation: its *eager twin*, the
  reference loop with the optimizer built `capturable=True` (run twice where the config differs
  from it: the runs must agree with each other, else the exact test cannot apply and the verdict
  says so; a config that replays its first run bit for bit needs no second). The twin keeps the
  reference's loop settings, not the config's: those are owed bit-exactness anyway, and a
  single twin per workload then also catches a stream bug inside a graph config.
- Settings that change the arithmetic (the capturable optimizer, `LoopConfig.compile` and
  `LoopConfig.optimizer`, any field in `NUMERICS_FIELDS`, or a precision other than the
  reference's, such as float8 against a bf16-autocast reference: `gate(precision=...,
  reference_precision=...)`) are owed statistical equivalence: the
  config's losses must stay within a multiple of the workload's own rounding noise around the
  reference (`gate.equivalence` defines the statistic, `gate.envelope` measures the
  noise). A config that changes arithmetic *and* loop settings is compared bit for bit with its
  eager twin (its own arithmetic settings, the reference's loop settings) as well.

Every exact test that fails asks whether the eager step is bit-reproducible at all on this
workload, device and precision (`trainers.gate.reproducibility`: the reference loop run twice,
cached per process; asked first where it is known). Where it is not, no bit-for-bit comparison
can mean anything: the exact test is skipped (`ParityVerdict.exact_skipped` names the first step
at which two identical eager runs differed, and by how much) and the equivalence test decides. A
config that matches bit for bit needs no probe: two runs that agree have shown it.

Every run starts from the same seed with dropout off and, by default, deterministic kernels
(`trainers.gate.trajectories.GATE_DETERMINISM`). `gate` runs what the config needs;
`check_parity` is its old name. Pass `reference`, `twin`, `envelope` and `probe` to reuse them:
each is a function of the workload, preset, seed, steps, precision and device only (the probe
not even of the seed and steps).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal, get_args

import torch

from trainers.config import REFERENCE, LoopConfig, field_names
from trainers.core import resolve_device
from trainers.gate.envelope import PERTURBATIONS, Envelope
from trainers.gate.equivalence import MULTIPLE, WINDOW, Equivalence
from trainers.gate.reproducibility import (
    Reproducibility,
    cached,
    check_probe,
    eager_reproducibility,
    fault_is_planted,
)
from trainers.gate.trajectories import (
    GATE_DETERMINISM,
    NO_DETERMINISTIC_IMPL,
    PARITY_STEPS,
    Determinism,
    deterministic,
    parity_losses,
    trajectory,
    trajectory_length,
)
from trainers.levers import defaults_where
from trainers.precision import Precision, check_precision_here
from trainers.workloads import WorkloadFactory

__all__ = [
    "GATE_TESTS",
    "GRAPH_RTOL",
    "NO_DETERMINISTIC_IMPL",
    "NUMERICS_FIELDS",
    "PARITY_STEPS",
    "SEEDS_DETERMINISM",
    "GateTest",
    "ParityVerdict",
    "Twin",
    "check_parity",
    "compare",
    "deterministic",
    "exact_length",
    "gate",
    "parity_losses",
    "reference_determinism",
    "required_test",
    "spread_for",
    "twin_of",
]

GRAPH_RTOL = 1e-3
"""Legacy: the relative per-step tolerance `compare(exact=False)` applies. `gate` no longer uses
it: a fixed relative tolerance rejected legitimate graph configs (a ResNet-18 at 0.198) and blows
up as the loss falls towards zero."""

SEEDS_DETERMINISM: Determinism = "off"
"""How the reference and its seed-to-seed envelope run (`spread_for` "seeds": a config in another
precision). Another seed draws other initial weights and other batches: its losses move at the
scale of the loss's own batch-to-batch noise, while a kernel's run-to-run rounding moves them at
the rounding envelope's (2.1e-5 over 200 steps on llama-1b in bf16,
docs/benchmarks/peers-h100-2026-11-26-llama-1b-float8.json). Strict determinism then buys that
judgement nothing and costs its five long runs (deterministic attention and embedding backward
kernels), and off, they run the kernels a timed run runs. The config itself still runs strict
whenever it owes its eager twin bit for bit."""

GateTest = Literal["exact", "equivalence", "exact+equivalence"]
GATE_TESTS: tuple[str, ...] = get_args(GateTest)

NUMERICS_FIELDS: Mapping[str, object] = defaults_where("equivalence")
"""LoopConfig fields that may change the arithmetic, with the value that does not: the levers
with a value of numerics class `equivalence` in the lever table (`trainers.levers`, which says
why each is). Read with getattr, so a LoopConfig without them (before they land) counts as the
default."""


@dataclasses.dataclass(kw_only=True, frozen=True)
class ParityVerdict:
    """The gate's verdict. The first eight fields keep their old meaning; the rest say which
    test applied and by how much it passed or failed.

    max_abs_deviation, max_rel_deviation, first_diverging_step: per step, against the reference.
    tolerance: 0 for an exact test alone; otherwise the equivalence bound of the decisive window.
    test: the tests that applied ("relative" for the legacy `compare(exact=False)`);
    exact_against: what the exact test compared with ("reference" or "eager twin").
    exact_skipped: why an exact test the config needed could not apply (an eager step or an eager
    twin that is not bitwise reproducible here).
    eager_reproducible, eager_first_difference, eager_max_abs_difference: the reproducibility
    probe (`trainers.gate.reproducibility`); None where no exact test was owed, or where the
    config replayed its eager twin bit for bit before the probe was known (it was not needed);
    for an exact test against the reference that matched, True from those two runs.
    graph_replays_twin, graph_first_difference: for a graph owed its twin's bits, the probe's
    one-stream graph against its eager twin (GPU only). determinism: the mode the config's runs
    (and its probe and twin) computed under; reference_determinism: the reference's and its
    envelope's (`SEEDS_DETERMINISM` against another precision; None in a verdict from before it
    was recorded). precision, reference_precision: what the config's runs and the reference (and
    its envelope) ran in. exact_steps: how many of the config's first steps the exact tests
    covered (None: no exact test was owed). passing_multiple: the least multiple of the envelope
    the equivalence test would pass at (None: no equivalence test, or a loss that is not
    finite).
    twin_max_abs_deviation, twin_first_diverging_step: the exact comparison with the eager twin.
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


@dataclasses.dataclass(kw_only=True, frozen=True)
class Twin:
    """A config's eager twin: `losses` is its first run. Run twice (`runs` 2), `reproducible`
    says whether the second gave the same losses bit for bit (`first_difference`: where it did
    not; `max_abs_difference`: by how much at most; None in a dict from before it was recorded).
    Run once (`runs` 1), `reproducible` is None: a config that replays those losses bit for bit
    shows by that alone that the arithmetic is reproducible, so the gate runs the twin a second
    time (`confirmed`) only when the config differs from it. At 1.1B with float8 each run is a
    compile and 20 strict steps: the second run was a third of the gate."""

    config: dict[str, Any]
    capturable: bool
    losses: tuple[float, ...]
    reproducible: bool | None
    first_difference: int | None
    strict: bool
    max_abs_difference: float | None = None
    runs: int = 2

    @classmethod
    def measure(
        cls,
        workload: str | WorkloadFactory,
        config: LoopConfig,
        steps: int = PARITY_STEPS,
        *,
        preset: str,
        seed: int = 0,
        device: str | torch.device = "auto",
        precision: Precision | None = None,
        runs: int = 2,
    ) -> Twin:
        """Run the eager twin of `config` (`twin_of`) `runs` times (1 or 2)."""
        if runs not in (1, 2):
            raise ValueError(f"runs={runs!r} is invalid: allowed 1 or 2")
        twin_config, capturable = twin_of(config)
        common: dict[str, Any] = {"steps": steps, "seed": seed, "device": device}
        common["precision"] = precision
        losses, strict = _twin_run(workload, preset, twin_config, capturable, common)
        once = cls(
            config=twin_config.to_dict(),
            capturable=capturable,
            losses=losses,
            reproducible=None,
            first_difference=None,
            strict=strict,
            runs=1,
        )
        if runs == 1:
            return once
        return once.confirmed(
            workload, preset=preset, seed=seed, device=device, precision=precision
        )

    def confirmed(
        self,
        workload: str | WorkloadFactory,
        *,
        preset: str,
        seed: int = 0,
        device: str | torch.device = "auto",
        precision: Precision | None = None,
        steps: int | None = None,
    ) -> Twin:
        """This twin with its second run (itself where it has one): whether it reproduces."""
        if self.runs == 2:
            return self
        length = len(self.losses) if steps is None else steps
        common = {"steps": length, "seed": seed, "device": device, "precision": precision}
        config, capturable = LoopConfig.from_dict(self.config), self.capturable
        second, second_strict = _twin_run(workload, preset, config, capturable, common)
        differ = _first_difference(second, self.losses)
        largest, _, _ = _per_step(second, self.losses)
        return dataclasses.replace(
            self,
            reproducible=differ is None and len(self.losses) == len(second),
            first_difference=differ,
            strict=self.strict and second_strict,
            max_abs_difference=largest,
            runs=2,
        )

    def to_dict(self) -> dict[str, Any]:
        values = dataclasses.asdict(self)
        values["losses"] = list(self.losses)
        return values

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> Twin:
        fields = {f.name: values[f.name] for f in dataclasses.fields(cls) if f.name in values}
        fields["losses"] = tuple(float(x) for x in fields["losses"])
        return cls(**fields)


def _twin_run(
    workload: str | WorkloadFactory,
    preset: str,
    twin_config: LoopConfig,
    capturable: bool,
    common: Mapping[str, Any],
) -> tuple[tuple[float, ...], bool]:
    """One run of an eager twin: its losses and whether it ran strict."""
    run = trajectory(workload, preset, twin_config, capturable=capturable, **common)
    # Losses only: the trained model leaves the device before the next run.
    return tuple(run.losses), run.strict


def twin_of(config: LoopConfig) -> tuple[LoopConfig, bool]:
    """The eager twin's config (the reference's loop settings, `config`'s NUMERICS_FIELDS) and
    whether its optimizer is capturable (exactly when `config` is a graph)."""
    names = field_names()
    keep = {name: getattr(config, name) for name in NUMERICS_FIELDS if name in names}
    return (REFERENCE.replace(**keep) if keep else REFERENCE), config.cuda_graph


def _changes_numerics(config: LoopConfig) -> bool:
    return any(
        getattr(config, name, default) != default for name, default in NUMERICS_FIELDS.items()
    )


def required_test(
    config: LoopConfig,
    *,
    precision: Precision | None = None,
    reference_precision: Precision | None = None,
) -> GateTest:
    """Which tests `config` is owed (see the module docstring).

    precision, reference_precision: what the config's runs and the reference run in (None for
    `reference_precision`: the config's). A config run in another precision than the reference
    changes the arithmetic as a NUMERICS_FIELDS setting does: float8 matmuls are never bit-exact
    against bf16 ones, so they are owed equivalence (and, with loop settings or a graph, their
    eager twin's bits in their own precision)."""
    twin_config, capturable = twin_of(config)
    other_precision = reference_precision is not None and reference_precision != precision
    if not capturable and not _changes_numerics(config) and not other_precision:
        return "exact"  # the twin is the reference itself
    if not capturable and twin_config == config:
        return "equivalence"  # the config is its own twin
    return "exact+equivalence"


def _first_difference(losses: Sequence[float], reference: Sequence[float]) -> int | None:
    for step, (a, b) in enumerate(zip(losses, reference, strict=False)):
        # NaN != NaN: a non-finite loss counts as a difference.
        if a != b:
            return step
    return None if len(losses) == len(reference) else min(len(losses), len(reference))


def _per_step(
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
    return max_abs, max_rel, _first_difference(losses, reference)


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
    max_abs, max_rel, first = _per_step(losses, reference)
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


def gate(
    workload: str | WorkloadFactory,
    config: LoopConfig,
    steps: int = PARITY_STEPS,
    *,
    preset: str,
    seed: int = 0,
    device: str | torch.device = "auto",
    reference: Sequence[float] | None = None,
    envelope: Envelope | None = None,
    twin: Twin | None = None,
    precision: Precision | None = None,
    test: GateTest | None = None,
    multiple: float = MULTIPLE,
    window: int = WINDOW,
    check_drift: bool = True,
    probe: Reproducibility | None = None,
    reference_precision: Precision | None = None,
    exact_steps: int | None = None,
) -> ParityVerdict:
    """Run `config` and what it is compared with, and judge it.

    reference, envelope, twin: reuse earlier measurements (the reference's losses, its noise
    envelope, `config`'s eager twin); whatever the test needs and is not given is measured here.
    probe: the eager step's reproducibility (`trainers.gate.reproducibility`); None takes it
    from the process cache or measures it (two runs of the reference loop) before the first
    exact test.
    precision: passed to every run (`run(precision=...)`), the reference's included unless
    `reference_precision` names another: then the reference and the envelope run in that one
    (it is the envelope's `precision`), and the config, its eager twin and the reproducibility
    probe in `precision` (float8 judged against bf16-autocast from the same weights and data).
    test: force a test instead of `required_test(config, ...)`; for a change the config does not
    show (an optimizer swapped by a workload factory), "equivalence" with the unchanged
    workload's `envelope`.
    multiple, window, check_drift: the equivalence statistic's (`trainers.gate.equivalence.judge`).
    exact_steps: the exact tests' length where shorter than `steps` (`exact_length`).
    Another precision: the reference and its envelope run under `SEEDS_DETERMINISM`, it strict.
    """
    ref_precision = precision if reference_precision is None else reference_precision
    chosen = _chosen_test(config, test, precision, ref_precision)
    short = exact_length(config, chosen, steps, exact_steps)
    if envelope is not None:
        _check_envelope(envelope, preset=preset, steps=steps, seed=seed, precision=ref_precision)
    reference = envelope.reference if reference is None and envelope is not None else reference
    common, reference_common = _run_arguments(
        steps=steps, seed=seed, device=device, precision=precision, reference=ref_precision
    )
    exact_common = {**common, "steps": short}
    fields = _run_fields(chosen, short, envelope, common, reference_common)
    reasons: list[str] = []
    exact = _ExactTests(workload, preset, config, exact_common, fields, reasons)
    chosen, ask_later = exact.probe_first(probe, chosen)
    if reference is None:
        reference = parity_losses(workload, preset, REFERENCE, **reference_common)
    losses = parity_losses(workload, preset, config, **common)
    if chosen == "exact+equivalence" and twin is None:
        twin = Twin.measure(workload, config, preset=preset, runs=1, **exact_common)
    if ask_later:
        target = reference if chosen == "exact" else twin.losses  # type: ignore[union-attr]
        chosen = exact.unless_matched(losses, target, chosen)
    if chosen == "exact":
        return dataclasses.replace(compare(losses, reference, exact=True, tolerance=0.0), **fields)
    return _judged_equivalent(
        workload,
        preset,
        config,
        chosen,
        losses=losses,
        reference=reference,
        envelope=envelope,
        twin=twin,
        twin_common=exact_common,
        reference_common=reference_common,
        fields=fields,
        reasons=reasons,
        judge={"window": window, "multiple": multiple, "check_drift": check_drift},
    )


def _run_fields(
    chosen: GateTest,
    exact_steps: int,
    envelope: Envelope | None,
    common: Mapping[str, Any],
    reference_common: Mapping[str, Any],
) -> dict[str, Any]:
    """The verdict's fields on how its runs computed."""
    return {
        "determinism": GATE_DETERMINISM,
        # What the reference computed under: a given envelope's own, else this run's.
        "reference_determinism": (
            envelope.determinism if envelope is not None else reference_common["determinism"]
        ),
        "precision": common["precision"],
        "reference_precision": reference_common["precision"],
        "exact_steps": None if chosen == "equivalence" else exact_steps,
    }


def _chosen_test(
    config: LoopConfig,
    test: GateTest | None,
    precision: Precision | None,
    reference_precision: Precision | None,
) -> GateTest:
    """`test` where given and valid (never "exact" across precisions), else `required_test`."""
    if test is not None and test not in GATE_TESTS:
        raise ValueError(f"test={test!r} is invalid: allowed {', '.join(GATE_TESTS)}")
    if test == "exact" and precision != reference_precision:
        raise ValueError(
            f"test='exact' is invalid for a config in {precision} against a reference in "
            f"{reference_precision}: another precision is never bit for bit"
        )
    return test or required_test(
        config, precision=precision, reference_precision=reference_precision
    )


def exact_length(config: LoopConfig, chosen: GateTest, steps: int, exact_steps: int | None) -> int:
    """How many steps the exact tests (the reproducibility probe, the eager twin) run: all
    `steps` for an exact test against the reference (it compares the whole run), else
    `exact_steps` (None: `steps`), lengthened to cover the config's warm-up and one step after
    it (a graph's capture and first replay); the config's first that many losses are held to
    its twin's bits, and all `steps` are judged for equivalence. A config in another precision
    is judged over a long run (200 steps for the float8 evidence), while a stream or capture bug
    shows within the gate's own 20: at full length its probe and twin would add four 200-step
    runs (at 1.1B, about 400 s)."""
    if exact_steps is not None and not 1 <= exact_steps <= steps:
        raise ValueError(f"exact_steps={exact_steps!r} is invalid: allowed 1 to steps ({steps})")
    if chosen == "exact":
        return steps
    wanted = steps if exact_steps is None else exact_steps
    return min(trajectory_length(config, wanted), trajectory_length(config, steps))


def _run_arguments(
    *,
    steps: int,
    seed: int,
    device: str | torch.device,
    precision: Precision | None,
    reference: Precision | None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The arguments of the config's runs (its losses, its eager twin, the probe) and of the
    reference's (its losses, its envelope): the same steps, seed and device, each in its own
    precision; the reference's under the determinism its envelope's spread asks
    (`SEEDS_DETERMINISM` against another precision)."""
    if precision != reference and precision is not None:
        # A candidate precision this device cannot run (float8 on a CPU) is refused in one
        # line before the reference's runs, not after them.
        check_precision_here(precision, resolve_device(device))
    common: dict[str, Any] = {"steps": steps, "seed": seed, "device": device}
    return {**common, "precision": precision}, {
        **common,
        "precision": reference,
        "determinism": reference_determinism(spread_for(precision, reference)),
    }


def _judged_equivalent(
    workload: str | WorkloadFactory,
    preset: str,
    config: LoopConfig,
    chosen: GateTest,
    *,
    losses: Sequence[float],
    reference: Sequence[float],
    envelope: Envelope | None,
    twin: Twin | None,
    twin_common: dict[str, Any],
    reference_common: dict[str, Any],
    fields: dict[str, Any],
    reasons: list[str],
    judge: dict[str, Any],
) -> ParityVerdict:
    """`gate`'s verdict for a config owed equivalence (after its twin, for a graph): the
    deviation from the reference within the envelope, measured here when not given. The twin
    runs `twin_common`'s steps (`gate`'s `exact_steps`)."""
    max_abs, max_rel, first = _per_step(losses, reference)
    fields.update(
        steps=len(reference),
        max_abs_deviation=max_abs,
        max_rel_deviation=max_rel,
        first_diverging_step=first,
    )
    exact_ok = True
    if chosen == "exact+equivalence":
        if twin is None:
            twin = Twin.measure(workload, config, preset=preset, runs=1, **twin_common)
        _check_twin(twin, config, steps=twin_common["steps"])
        if _first_difference(losses[: len(twin.losses)], twin.losses) is not None:
            # The config differs: is the twin itself reproducible? (Only then is it a bug.)
            twin = twin.confirmed(workload, preset=preset, **twin_common)
        exact_ok, chosen = _against_twin(config, losses, twin, fields, reasons)

    if envelope is None:
        envelope = Envelope.measure(
            workload,
            preset,
            perturbations=PERTURBATIONS,
            reference=reference,
            spread=spread_for(fields["precision"], fields["reference_precision"]),
            **reference_common,
        )
    eq = envelope.judge(losses, **judge)
    if envelope.spread == "seeds":
        reasons.append(
            f"judged against the reference's seed-to-seed envelope "
            f"({len(envelope.perturbed)} other seeds in {envelope.precision or 'fp32'})"
        )
    reasons.append(eq.reason)
    if envelope.spread == "seeds" and not eq.passed and eq.passing_multiple is not None:
        # The multiple is the user's to set here: say what it would take (rounded up, so that
        # the figure shown does pass).
        reasons.append(f"it would pass within {_round_up(eq.passing_multiple)}x the envelope")
    if fields.get("exact_skipped"):
        fields["exact_steps"] = None  # no exact test covered any step
    return ParityVerdict(
        passed=exact_ok and eq.passed,
        exact_required="exact_against" in fields,
        tolerance=eq.bound,
        reason="; ".join(reasons),
        test=chosen,
        losses=tuple(losses),
        **fields,
        **_equivalence_fields(eq),
    )


def spread_for(precision: Precision | None, reference_precision: Precision | None) -> str:
    """The envelope a config is judged against (`Envelope.spread`): a config in the reference's
    own precision may only round differently ("rounding"); one in another precision (float8
    against bf16) is owed no more than another seed of the reference moves ("seeds")."""
    return "rounding" if precision == reference_precision else "seeds"


def _round_up(value: float, digits: int = 3) -> str:
    """`value` to `digits` significant digits, rounded up."""
    if value <= 0:
        return "0"
    scale = 10 ** (digits - 1 - math.floor(math.log10(value)))
    return f"{math.ceil(value * scale - 1e-9) / scale:.{digits}g}"


def reference_determinism(spread: str) -> Determinism:
    """How the reference and its envelope of this spread run: strict for a rounding envelope
    (its configs may owe the reference's bits), `SEEDS_DETERMINISM` for a seed-to-seed one."""
    return SEEDS_DETERMINISM if spread == "seeds" else GATE_DETERMINISM


@dataclasses.dataclass(frozen=True)
class _ExactTests:
    """What `gate` asks before an exact test, for one config's runs (`common`: their arguments),
    recording into the verdict's `fields` and `reasons`: whether two identical eager runs can
    agree bit for bit here at all (the reproducibility probe), asked first where it is known and
    otherwise only once the exact comparison fails."""

    workload: str | WorkloadFactory
    preset: str
    config: LoopConfig
    common: Mapping[str, Any]
    fields: dict[str, Any]
    reasons: list[str]

    def probe_first(self, probe: Reproducibility | None, chosen: GateTest) -> tuple[GateTest, bool]:
        """Known (given, or cached in this process): asked now, before any exact test. Unknown:
        asked only if the exact comparison fails (`unless_matched`), since a config that matches
        bit for bit has shown it, and the probe is two eager runs. Returns the test left and
        whether the probe waits. A planted fault never waits: the probe must refuse under it."""
        if chosen == "equivalence":
            return chosen, False
        if probe is None:
            device, precision = self.common["device"], self.common["precision"]
            probe = cached(self.workload, self.preset, device=device, precision=precision)
        if probe is None and not fault_is_planted():
            return chosen, True
        return self.skip_unless_reproducible(probe, chosen), False

    def unless_matched(
        self, losses: Sequence[float], target: Sequence[float], chosen: GateTest
    ) -> GateTest:
        """The test left when the probe was not known before: `chosen` as it is where `losses`
        match the exact test's `target` (the reference, or the eager twin's first run) bit for
        bit over the target's length, for two runs that agree bit for bit have shown the
        arithmetic reproducible; otherwise the probe decides, measured now, as it would have
        before."""
        if _first_difference(losses[: len(target)], target) is not None:
            return self.skip_unless_reproducible(None, chosen)
        if chosen == "exact":
            # The config and the reference are two eager runs of the same arithmetic.
            self.fields.update(eager_reproducible=True, eager_first_difference=None)
            self.fields.update(eager_max_abs_difference=0.0)
        return chosen

    def skip_unless_reproducible(self, probe: Reproducibility | None, chosen: GateTest) -> GateTest:
        """The test left once the probe (None: measured now) has answered: `chosen` where the
        eager step is bitwise reproducible (and, for a graph owed its twin's bits, where the
        one-stream graph replays its twin), else "equivalence" with the skip recorded."""
        common, fields = self.common, self.fields
        if probe is None:
            probe = eager_reproducibility(self.workload, self.preset, **common)
        else:
            device, precision = common["device"], common["precision"]
            check_probe(probe, self.workload, self.preset, device=device, precision=precision)
        fields.update(
            eager_reproducible=probe.reproducible,
            eager_first_difference=probe.first_difference,
            eager_max_abs_difference=probe.max_abs_difference,
        )
        graph_owed_twin = chosen == "exact+equivalence" and self.config.cuda_graph
        if graph_owed_twin and probe.graph_replays_twin is not None:
            fields.update(
                graph_replays_twin=probe.graph_replays_twin,
                graph_first_difference=probe.graph_first_difference,
            )
        if probe.reproducible and not (graph_owed_twin and probe.graph_replays_twin is False):
            return chosen
        skipped = (
            probe.skipped_reason() if not probe.reproducible else probe.capture_skipped_reason()
        )
        fields["exact_skipped"] = skipped
        self.reasons.append(skipped)
        return "equivalence"


def _against_twin(
    config: LoopConfig,
    losses: Sequence[float],
    twin: Twin,
    fields: dict[str, Any],
    reasons: list[str],
) -> tuple[bool, GateTest]:
    """The exact comparison with the eager twin: (passed, the test that applied), the figures
    and reason recorded in `fields`/`reasons`. A twin that differs from itself cannot be
    matched bit for bit: the test falls back to equivalence alone."""
    if twin.reproducible is False:
        size = (
            "" if twin.max_abs_difference is None else f", max |diff| {twin.max_abs_difference:.2g}"
        )
        fields["exact_skipped"] = (
            f"eager twin is not bitwise reproducible (its two runs differ from step "
            f"{twin.first_difference}{size}), so the exact test cannot apply"
        )
        reasons.append(fields["exact_skipped"])
        return True, "equivalence"
    # The config's first steps against a twin run only that long (`gate`'s `exact_steps`).
    twin_abs, _, twin_first = _per_step(losses[: len(twin.losses)], twin.losses)
    fields.update(
        exact_against="eager twin",
        twin_max_abs_deviation=twin_abs,
        twin_first_diverging_step=twin_first,
    )
    subject = "graph" if config.cuda_graph else "config"
    if twin_first is None:
        reasons.append(f"{subject} replays its eager twin bit for bit")
        return True, "exact+equivalence"
    # Not always our bug: a kernel may compute other bits when captured or on another stream. On
    # an H100 (torch 2.11) BERT's eager graph left its twin by ~1e-6 with SDPA's memory-efficient
    # attention and replayed it bit for bit with the math backend; with a second stream or
    # prefetch it left it from an eager warm-up step whatever the backend, cause not found
    # (benchmarks/diagnose_graph_parity.py --sdpa math; docs/benchmarks/README.md, 2026-11-24).
    cause = (
        "a capture or stream bug, or a kernel whose bits change when captured or on another stream"
        if config.cuda_graph
        else "a stream bug"
    )
    reasons.append(
        f"{subject} does not replay its eager twin bit for bit: first differs at step "
        f"{twin_first} (max |diff| {twin_abs:.2g}), {cause}"
    )
    return False, "exact+equivalence"


def _equivalence_fields(eq: Equivalence) -> dict[str, Any]:
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


def _check_envelope(
    envelope: Envelope, *, preset: str, steps: int, seed: int, precision: Precision | None
) -> None:
    """An envelope of other runs would judge against another reference: refuse it."""
    wanted = {"preset": preset, "steps": steps, "seed": seed, "precision": precision}
    got = {key: getattr(envelope, key) for key in wanted}
    if got != wanted:
        raise ValueError(f"envelope measured for {got}, the gate runs {wanted}")


def _check_twin(twin: Twin, config: LoopConfig, *, steps: int) -> None:
    expected, capturable = twin_of(config)
    length = trajectory_length(expected, steps)
    if len(twin.losses) != length:
        raise ValueError(f"twin ran {len(twin.losses)} steps, the exact test runs {length}")
    if twin.config != expected.to_dict() or twin.capturable != capturable:
        raise ValueError(
            f"twin is the eager twin of {twin.config} (capturable={twin.capturable}), not of "
            f"this config, whose twin is {expected.to_dict()} (capturable={capturable})"
        )


def check_parity(
    workload: str | WorkloadFactory,
    config: LoopConfig,
    steps: int = PARITY_STEPS,
    *,
    preset: str,
    seed: int = 0,
    device: str | torch.device = "auto",
    reference: Sequence[float] | None = None,
    envelope: Envelope | None = None,
    twin: Twin | None = None,
    precision: Precision | None = None,
    probe: Reproducibility | None = None,
) -> ParityVerdict:
    """The gate (`gate`) under its old name and signature, with the new optional inputs."""
    return gate(
        workload,
        config,
        steps,
        preset=preset,
        seed=seed,
        device=device,
        reference=reference,
        envelope=envelope,
        twin=twin,
        precision=precision,
        probe=probe,
    )
