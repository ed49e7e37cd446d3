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
  eager twin (its own arithmetic settings, the reference's loop settings) as well; or, asked
  (`gate(twin_kind="loop")`) and where it has no graph, its loop settings are checked on the
  reference's arithmetic against the reference's bits (its *loop twin*), and its own run is owed
  equivalence alone (`trainers.gate.twin` says why, `config_determinism` how it then runs).

Every exact test that fails asks whether the eager step is bit-reproducible at all on this
workload, device and precision (`trainers.gate.reproducibility`: the reference loop run twice,
cached per process; asked first where it is known). Where it is not, no bit-for-bit comparison
can mean anything: the exact test is skipped (`ParityVerdict.exact_skipped` names the first step
at which two identical eager runs differed, and by how much) and the equivalence test decides. A
config that matches bit for bit needs no probe: two runs that agree have shown it.

Every run starts from the same seed with dropout off and, by default, deterministic kernels
(`trainers.gate.trajectories.GATE_DETERMINISM`), except the reference against a seed envelope and a
config owed no bits, which compute as that reference does (`config_determinism`), and a config
run elsewhere with its eager twin, both with the process's own kernels (`gate`'s `determinism`).
`gate` runs what the config needs, each run a trajectory of its `RunArgs` (`check_parity` is its
name in `trainers`). Pass `reference`, `twin`, `envelope` and `probe` to reuse them: each is a
function of the workload, preset, seed, steps, precision and device only (the probe not even of
the seed and steps).

This module decides and judges; its parts live beside it, and their public names are importable
from here too: the verdict and the step-by-step `compare` (`trainers.gate.verdict`), the eager
twin (`trainers.gate.twin`: `Twin`, `twin_of`, `NUMERICS_FIELDS`), the probe and the comparison
with the twin (`trainers.gate.exact`), and the reference's runs and envelope
(`trainers.gate.reference`: `spread_for`, `reference_determinism`, `SEEDS_DETERMINISM`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from trainers.config import REFERENCE, LoopConfig
from trainers.gate.envelope import PERTURBATIONS, Envelope
from trainers.gate.equivalence import MULTIPLE, WINDOW, Equivalence
from trainers.gate.exact import ExactTests
from trainers.gate.reference import (
    SEEDS_DETERMINISM,
    GateRuns,
    check_envelope,
    reference_determinism,
    run_arguments,
    spread_for,
)
from trainers.gate.reproducibility import Reproducibility
from trainers.gate.trajectories import (
    DETERMINISMS,
    GATE_ARGS,
    GATE_DETERMINISM,
    NO_DETERMINISTIC_IMPL,
    PARITY_STEPS,
    Determinism,
    deterministic,
    parity_losses,
    trajectory_length,
)
from trainers.gate.twin import NUMERICS_FIELDS, Twin, TwinKind, twin_kind, twin_of
from trainers.gate.verdict import (
    GATE_TESTS,
    GRAPH_RTOL,
    GateTest,
    ParityVerdict,
    compare,
    equivalence_fields,
    per_step,
    with_workers_hint,
)
from trainers.levers import defaults_where
from trainers.precision import Precision
from trainers.runargs import RunArgs
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
    "config_determinism",
    "deterministic",
    "exact_length",
    "gate",
    "parity_losses",
    "reference_determinism",
    "required_test",
    "spread_for",
    "twin_of",
]


def _changes_numerics(config: LoopConfig) -> bool:
    # Read live (as NUMERICS_FIELDS is): a lever module registered since is in the table too.
    return any(
        config.get(name) != default for name, default in defaults_where("equivalence").items()
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


def config_determinism(
    config: LoopConfig,
    chosen: GateTest,
    *,
    twin: TwinKind = "eager",
    reference: Determinism = GATE_DETERMINISM,
) -> Determinism:
    """How the config's own run of a gate computes, given the test `chosen` for it, the kind of
    twin asked (`twin_kind`) and how the reference runs (`reference_determinism`): strict
    where the config is owed bits (the reference's, or its eager twin's), else as the reference
    runs. Against a seed-to-seed envelope that is the process's own kernels, the ones a timed
    trial compiled, so a compiled config reuses its trial's kernels instead of compiling again
    under strict determinism."""
    owes_bits = chosen == "exact" or (
        chosen == "exact+equivalence" and twin_kind(config, twin) == "eager"
    )
    return GATE_DETERMINISM if owes_bits else reference


def gate(
    workload: str | WorkloadFactory,
    config: LoopConfig,
    args: RunArgs = GATE_ARGS,
    *,
    preset: str,
    reference: Sequence[float] | None = None,
    envelope: Envelope | None = None,
    twin: Twin | None = None,
    twin_kind: TwinKind = "eager",
    test: GateTest | None = None,
    multiple: float = MULTIPLE,
    window: int = WINDOW,
    check_drift: bool = True,
    probe: Reproducibility | None = None,
    reference_precision: Precision | None = None,
    exact_steps: int | None = None,
    losses: Sequence[float] | None = None,
    determinism: Determinism | None = None,
) -> ParityVerdict:
    """Run `config` and what it is compared with, and judge it. reference, envelope, twin:
    reuse earlier measurements (the reference's losses, its noise envelope, `config`'s twin of
    kind `twin_kind`: "eager" or, for a config with no graph, "loop", `trainers.gate.twin`);
    whatever the test needs and is not given is measured here.
    probe: the eager step's reproducibility (`trainers.gate.reproducibility`); None takes it
    from the process cache or measures it (two runs of the reference loop) when asked.
    args: every run's steps, seed, device and precision (`GATE_ARGS` by default): the config's,
    and the reference's unless `reference_precision` names another, which the reference and
    the envelope (its `precision`) then run in, under `SEEDS_DETERMINISM` (float8 judged
    against bf16-autocast from the same weights and data).
    test: force a test instead of `required_test(config, ...)`; for a change the config does not
    show (an optimizer swapped by a workload factory), "equivalence" with its `envelope`.
    multiple, window, check_drift: the equivalence statistic's (`trainers.gate.equivalence.judge`).
    exact_steps: the exact tests' length where shorter than `steps` (`exact_length`). losses:
    the config's own run (`parity_losses` of `config`, `args`, `config_determinism`) run
    elsewhere (None: run here), computed as `determinism` says where given (`_Given`)."""
    precision, steps = args.precision, _checked_steps(config, args.steps)
    reference_precision = precision if reference_precision is None else reference_precision
    chosen = _chosen_test(config, test, precision, reference_precision)
    short = exact_length(config, chosen, steps, exact_steps)
    if envelope is not None:
        at = {"steps": steps, "seed": args.seed, "precision": reference_precision}
        check_envelope(envelope, preset=preset, **at)  # type: ignore[arg-type]
    reference = envelope.reference if reference is None and envelope is not None else reference
    runs_of = run_arguments(args, reference=reference_precision)
    kind = _twin_kind(config, twin_kind, given=twin if chosen == "exact+equivalence" else None)
    given = _Given(determinism, losses, twin)
    own = given.mode(config, chosen, kind, runs_of.reference_determinism)
    fields = _run_fields(chosen, short, envelope, runs_of, own)
    exact = ExactTests(workload, preset, config, args.replace(steps=short), fields, [], kind)
    runs = _Runs(exact, runs_of)
    chosen, losses, reference, twin = runs.measure(chosen, probe, reference, twin, losses)
    if chosen == "exact":
        verdict = compare(losses, reference, exact=True, tolerance=0.0)
        reason = with_workers_hint(verdict, config.num_workers)  # why, where it can tell
        return dataclasses.replace(verdict, **fields, reason=reason)
    judge = {"window": window, "multiple": multiple, "check_drift": check_drift}
    return runs.judged_equivalent(
        chosen, losses, reference, envelope=envelope, twin=twin, judge=judge
    )


def _checked_steps(config: LoopConfig, steps: int) -> int:
    """`steps`, or a ValueError where `config`'s warm-up (a graph's capture) gives more losses
    than `steps`, the reference's: every test failed at "inf" (an H200, 2026-12-05)."""
    if trajectory_length(config, steps) != steps:
        raise ValueError(
            f"steps={steps} is invalid for this config: allowed "
            f"{trajectory_length(config, 1)} or more (its warm-up and one step after)"
        )
    return steps


@dataclasses.dataclass(frozen=True)
class _Given:
    """What `gate` was given of the config's run made elsewhere: how it computed (None: as
    `config_determinism` says; "off" for a run owed its eager twin's bits and made, as the given
    twin was, with the process's own kernels, whose bits are as comparable as strict ones:
    `tuner.search.gating.kept` says when the search does that), its losses, and the twin."""

    determinism: Determinism | None
    losses: Sequence[float] | None
    twin: Twin | None

    def mode(
        self, config: LoopConfig, chosen: GateTest, kind: TwinKind, reference: Determinism
    ) -> Determinism:
        """How the config's run computed: `config_determinism` (`own`), or the given mode for
        losses run elsewhere. Another mode than `own` only for a run owed its eager twin's bits
        judged against a reference with the process's own kernels (`reference` "off", a seed
        envelope's): against strict bits or a strict rounding envelope other kernels' losses
        would be judged against the rounding of strict ones. A given eager twin computed
        otherwise would hold the run to other kernels' bits."""
        own = config_determinism(config, chosen, twin=kind, reference=reference)
        owed = chosen == "exact+equivalence" and kind == "eager"
        twin = self.twin if owed else None
        given, mode = self.determinism, own
        if given is not None:
            if given not in DETERMINISMS:
                allowed = ", ".join(DETERMINISMS)
                raise ValueError(f"determinism={given!r} is invalid: allowed {allowed}")
            if self.losses is None:
                raise ValueError("determinism is how given losses computed: it needs losses")
            if given != own and not (owed and reference == "off"):
                raise ValueError(
                    f"determinism={given!r} is invalid here: the config's run computes {own} "
                    "unless it owes its eager twin's bits and is judged against a seed envelope"
                )
            mode = given
        if twin is not None and twin.determinism != mode:
            raise ValueError(
                f"the eager twin computed {twin.determinism}, the config's run {mode}: its "
                "bits are owed only to a twin of the same kernels"
            )
        return mode


def _twin_kind(config: LoopConfig, wanted: TwinKind, *, given: Twin | None) -> TwinKind:
    """The kind of twin `config` is compared through where `wanted` is asked; a `given` twin of
    another kind would hold it to other bits: refused."""
    if wanted not in ("eager", "loop"):
        raise ValueError(f"twin_kind={wanted!r} is invalid: allowed eager or loop")
    kind = twin_kind(config, wanted)
    if given is not None and given.kind != kind:
        raise ValueError(
            f"twin is a {given.kind} twin, and this gate compares {config.to_dict()} through "
            f"its {kind} twin (twin_kind={wanted!r})"
        )
    return kind


check_parity = gate
"""`gate` by its first name, as `trainers` exports it (there `trainers.gate` is the package)."""


def _run_fields(
    chosen: GateTest,
    exact_steps: int,
    envelope: Envelope | None,
    runs: GateRuns,
    own: Determinism,
) -> dict[str, Any]:
    """The verdict's fields on how its runs computed (`own`: the config's run's mode,
    `config_determinism`)."""
    return {
        "determinism": own,
        # What the reference computed under: a given envelope's own, else this run's.
        "reference_determinism": (
            envelope.determinism if envelope is not None else runs.reference_determinism
        ),
        "precision": runs.config.precision,
        "reference_precision": runs.reference.precision,
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


@dataclasses.dataclass(frozen=True)
class _Runs:
    """The runs of one `gate` call: the config's and the reference's (`runs`: their arguments)
    and its exact tests' (`exact`, over `exact_length`'s steps, recording into the verdict's
    fields and reasons)."""

    exact: ExactTests
    runs: GateRuns

    def measure(
        self,
        chosen: GateTest,
        probe: Reproducibility | None,
        reference: Sequence[float] | None,
        twin: Twin | None,
        losses: Sequence[float] | None,
    ) -> tuple[GateTest, Sequence[float], Sequence[float], Twin | None]:
        """The test left once the probe has answered (asked first where known, else only if the
        exact comparison fails: `ExactTests`), the config's losses, the reference's, and the
        twin where the test needs one (an eager twin's first run only): each measured here where
        not given."""
        exact = self.exact
        workload, preset, config = exact.workload, exact.preset, exact.config
        # Chosen before the probe may waive the bits: a run made elsewhere (`losses`) cannot
        # know the probe's answer.
        runs = self.runs
        own: Determinism = exact.fields["determinism"]  # `config_determinism`, in `gate`
        chosen, ask_later = exact.probe_first(probe, chosen)
        if reference is None:
            mode = runs.reference_determinism
            reference = parity_losses(workload, preset, REFERENCE, runs.reference, determinism=mode)
        if losses is None:
            losses = parity_losses(workload, preset, config, runs.config, determinism=own)
        elif len(losses) != runs.config.steps:
            raise ValueError(
                f"losses of {len(losses)} steps given, the gate runs {runs.config.steps}"
            )
        if chosen == "exact+equivalence" and twin is None:
            strict = runs.reference_determinism == "strict"
            twin = Twin.measure(
                workload,
                config,
                exact.args,
                preset=preset,
                runs=1,
                kind=exact.twin,
                reference_precision=runs.reference.precision,
                reference=reference if strict else None,
                determinism=own,  # an eager twin's bits are owed by a run of the same kernels
            )
        if ask_later:
            target = reference if chosen == "exact" else twin.losses  # type: ignore[union-attr]
            chosen = exact.unless_matched(losses, target, chosen, twin)
        return chosen, losses, reference, twin

    def judged_equivalent(
        self,
        chosen: GateTest,
        losses: Sequence[float],
        reference: Sequence[float],
        *,
        envelope: Envelope | None,
        twin: Twin | None,
        judge: dict[str, Any],
    ) -> ParityVerdict:
        """`gate`'s verdict for a config owed equivalence (after its twin, for a graph): the
        deviation from the reference within the envelope, measured here when not given. The twin
        runs the exact tests' steps (`gate`'s `exact_steps`)."""
        exact, fields = self.exact, self.exact.fields
        max_abs, max_rel, first = per_step(losses, reference)
        fields.update(
            steps=len(reference),
            max_abs_deviation=max_abs,
            max_rel_deviation=max_rel,
            first_diverging_step=first,
        )
        exact_ok = True
        if chosen == "exact+equivalence":
            exact_ok, chosen = exact.against_twin(losses, twin)
        if envelope is None:
            envelope = Envelope.measure(
                exact.workload,
                exact.preset,
                self.runs.reference,
                perturbations=PERTURBATIONS,
                reference=reference,
                spread=spread_for(fields["precision"], fields["reference_precision"]),
                determinism=self.runs.reference_determinism,
            )
        eq = envelope.judge(losses, **judge)
        exact.reasons.extend(_equivalence_reasons(envelope, eq))
        if fields.get("exact_skipped"):
            fields["exact_steps"] = None  # no exact test covered any step
        return ParityVerdict(
            passed=exact_ok and eq.passed,
            exact_required="exact_against" in fields,
            tolerance=eq.bound,
            reason="; ".join(exact.reasons),
            test=chosen,
            losses=tuple(losses),
            **fields,
            **equivalence_fields(eq),
        )


def _equivalence_reasons(envelope: Envelope, eq: Equivalence) -> list[str]:
    """The equivalence test's part of the verdict's reason: against a seed-to-seed envelope,
    which one judged it; the test's own reason; and, failed there, the multiple it would pass at."""
    reasons: list[str] = []
    if envelope.spread == "seeds":
        reasons.append(envelope.judged_against())
    reasons.append(eq.reason)
    if envelope.spread == "seeds" and not eq.passed and eq.passing_multiple is not None:
        # The multiple is the user's to set here: say what it would take (rounded up, so that
        # the figure shown does pass).
        reasons.append(f"it would pass within {_round_up(eq.passing_multiple)}x the envelope")
    return reasons


def _round_up(value: float, digits: int = 3) -> str:
    """`value` to `digits` significant digits, rounded up."""
    if value <= 0:
        return "0"
    scale = 10 ** (digits - 1 - math.floor(math.log10(value)))
    return f"{math.ceil(value * scale - 1e-9) / scale:.{digits}g}"
