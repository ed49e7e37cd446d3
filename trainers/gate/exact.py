"""The gate's exact tests (`ExactTests`): whether a bit-for-bit comparison can mean anything here
(the reproducibility probe, `trainers.gate.reproducibility`), and the comparison of a config with
its eager twin, or of its loop twin with the reference (`trainers.gate.twin`). An exact test
against the reference is `compare`'s (`trainers.gate.verdict`); `trainers.gate.parity` says
which tests a config is owed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from trainers.config import LoopConfig
from trainers.gate.reproducibility import (
    Reproducibility,
    cached,
    check_probe,
    eager_reproducibility,
    fault_is_planted,
)
from trainers.gate.twin import Twin, TwinKind, check_twin
from trainers.gate.verdict import GateTest, first_difference, per_step
from trainers.runargs import RunArgs
from trainers.workloads import WorkloadFactory

__all__ = ["TWIN_NOISE_MULTIPLE", "ExactTests", "within_twin_noise"]

TWIN_NOISE_MULTIPLE = 2.0
"""How far a config with the process's own kernels ("off") may leave its eager twin where those
kernels do not reproduce (the twin's two runs differ): this many times the twin's own largest
run-to-run difference. On an H100 (torch 2.11, c1bf87b) every compiled decoder and transformer
step measured gave other bits from run to run with its own kernels, with either SDPA backend
(docs/benchmarks/kept-bits-h100-*): no bit-for-bit test can hold there, while a correct graph and
a second run of its twin are two draws of the same noise. Measured three times on an H100
(docs/benchmarks/gpu-tests-h100-2026-12-05-twin-noise*), a correct graph left its twin by 0.74
to 2.38 times the twin's own difference, and the weakest planted fault, the learning rate x 0.99
on transformer small in fp32, by 4.1 to 9.2 times (on two layers of a 1B decoder 52 to 60; the
stale graph input and the stream faults 98 and more). Two: a correct graph beyond it falls back
to the strict check (time, not a verdict); a fault within it would pass, so the margin is kept
on the faults' side."""


def within_twin_noise(losses: Sequence[float], twin: Twin) -> tuple[bool, float, float | None]:
    """Whether `losses` stay within `TWIN_NOISE_MULTIPLE` times `twin`'s own run-to-run
    difference over the twin's steps, for a twin run twice with the process's own kernels that
    did not reproduce; (within, the largest |losses - twin|, the twin's largest difference).
    Any other twin (strict, run once, or reproducible) has no noise to be within, nor one whose
    runs differ by an infinite amount (a non-finite loss in either): False."""
    largest, _, _ = per_step(losses[: len(twin.losses)], twin.losses)
    noise = twin.max_abs_difference
    if not twin.noisy or noise is None or not 0.0 < noise < math.inf:
        return False, largest, noise
    return largest <= TWIN_NOISE_MULTIPLE * noise, largest, noise


@dataclasses.dataclass(frozen=True)
class ExactTests:
    """What `gate` asks before an exact test, for one config's runs (`args`: their arguments),
    recording into the verdict's `fields` and `reasons`: whether two identical eager runs can
    agree bit for bit here at all (the reproducibility probe), asked first where it is known and
    otherwise only once the exact comparison fails; and, for a config owed its eager twin's bits,
    that comparison (`against_twin`)."""

    workload: str | WorkloadFactory
    preset: str
    config: LoopConfig
    args: RunArgs
    fields: dict[str, Any]
    reasons: list[str]
    twin: TwinKind = "eager"
    """The kind of twin an "exact+equivalence" test compares (`trainers.gate.twin.twin_kind`)."""

    def probe_first(self, probe: Reproducibility | None, chosen: GateTest) -> tuple[GateTest, bool]:
        """Known (given, or cached in this process): asked now, before any exact test. Unknown:
        asked only if the exact comparison fails (`unless_matched`), since a config that matches
        bit for bit has shown it, and the probe is two eager runs. Returns the test left and
        whether the probe waits. A planted fault never waits: the probe must refuse under it."""
        if chosen == "equivalence" or (chosen == "exact+equivalence" and self.twin == "loop"):
            # A loop twin is compared with the reference, and asks the probe of the reference's
            # precision itself, only where they differ (`against_twin`).
            return chosen, False
        if probe is None:
            device, precision = self.args.device, self.args.precision
            probe = cached(self.workload, self.preset, device=device, precision=precision)
        if probe is None and not fault_is_planted():
            return chosen, True
        return self.skip_unless_reproducible(probe, chosen), False

    def unless_matched(
        self,
        losses: Sequence[float],
        target: Sequence[float],
        chosen: GateTest,
        twin: Twin | None = None,
    ) -> GateTest:
        """The test left when the probe was not known before: `chosen` as it is where `losses`
        match the exact test's `target` (the reference, or the eager twin's first run) bit for
        bit over the target's length, for two runs that agree bit for bit have shown the
        arithmetic reproducible; otherwise the probe decides, measured now, as it would have
        before. Not for an eager `twin` that did not reproduce with the process's own kernels:
        its test compares no bits (`within_twin_noise`), and the probe's strict runs would
        tell it nothing."""
        if twin is not None and twin.noisy and chosen == "exact+equivalence":
            return chosen
        if first_difference(losses[: len(target)], target) is not None:
            return self.skip_unless_reproducible(None, chosen)
        if chosen == "exact":
            # The config and the reference are two eager runs of the same arithmetic.
            self.fields.update(eager_reproducible=True, eager_first_difference=None)
            self.fields.update(eager_max_abs_difference=0.0)
        return chosen

    def skip_unless_reproducible(
        self,
        probe: Reproducibility | None,
        chosen: GateTest,
        *,
        args: RunArgs | None = None,
        reference: Sequence[float] | None = None,
    ) -> GateTest:
        """The test left once the probe (None: measured now) has answered: `chosen` where the
        eager step is bitwise reproducible (and, for a graph owed its twin's bits, where the
        one-stream graph replays its twin), else "equivalence" with the skip recorded.
        `args`: the probe's runs where not the config's (a loop twin's, in the reference's
        precision); `reference`: the reference's losses for them, the probe's first run."""
        fields = self.fields
        args = self.args if args is None else args
        if probe is None:
            probe = eager_reproducibility(self.workload, self.preset, args, reference=reference)
        else:
            device, precision = args.device, args.precision
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

    def against_twin(self, losses: Sequence[float], twin: Twin | None) -> tuple[bool, GateTest]:
        """The exact test against the eager twin (measured here when not given, over `args`'
        steps: `gate`'s `exact_steps`), or a loop twin's against the reference: (passed, the
        test that applied)."""
        if twin is None:
            twin = Twin.measure(
                self.workload,
                self.config,
                self.args,
                preset=self.preset,
                runs=1,
                kind=self.twin,
                reference_precision=self.fields["reference_precision"],
            )
        check_twin(twin, self.config, steps=self.args.steps)
        if twin.kind == "loop":
            return self._loop_twin_against_reference(twin)
        if first_difference(losses[: len(twin.losses)], twin.losses) is not None:
            # The config differs: is the twin itself reproducible? (Only then is it a bug.)
            twin = twin.confirmed(self.workload, self.args, preset=self.preset)
        return self._compared_with_twin(losses, twin)

    def _loop_twin_against_reference(self, twin: Twin) -> tuple[bool, GateTest]:
        """A loop twin's exact test: its losses against the reference's strict ones (both in
        the reference's precision); where they differ, the probe of that precision says whether
        two identical runs could have agreed (only then is it a bug)."""
        fields, reasons = self.fields, self.reasons
        assert twin.reference is not None, "a loop twin holds the reference's losses"
        if twin.precision != fields["reference_precision"]:
            raise ValueError(
                f"loop twin ran in {twin.precision}, the gate's reference in "
                f"{fields['reference_precision']}"
            )
        differ = first_difference(twin.losses, twin.reference)
        if differ is not None:
            args = self.args.replace(precision=twin.precision)
            chosen = self.skip_unless_reproducible(
                None, "exact+equivalence", args=args, reference=twin.reference
            )
            if chosen == "equivalence":
                return True, chosen
        largest, _, first = per_step(twin.losses, twin.reference)
        fields.update(
            exact_against="loop twin",
            twin_max_abs_deviation=largest,
            twin_first_diverging_step=first,
        )
        if first is None:
            reasons.append(
                "its loop settings on the reference's arithmetic replay the reference bit for bit"
            )
            return True, "exact+equivalence"
        reasons.append(
            f"its loop settings on the reference's arithmetic do not replay the reference bit "
            f"for bit: first differs at step {first} (max |diff| {largest:.2g}), a stream bug"
        )
        return False, "exact+equivalence"

    def _compared_with_twin(self, losses: Sequence[float], twin: Twin) -> tuple[bool, GateTest]:
        """The exact comparison with the eager twin: (passed, the test that applied), the figures
        and reason recorded in `fields`/`reasons`. A twin that differs from itself cannot be
        matched bit for bit: the test falls back to equivalence alone."""
        fields, reasons = self.fields, self.reasons
        if twin.noisy:
            return self._within_twin_noise(losses, twin)
        if twin.reproducible is False:
            size = (
                ""
                if twin.max_abs_difference is None
                else f", max |diff| {twin.max_abs_difference:.2g}"
            )
            fields["exact_skipped"] = (
                f"eager twin is not bitwise reproducible (its two runs differ from step "
                f"{twin.first_difference}{size}), so the exact test cannot apply"
            )
            reasons.append(fields["exact_skipped"])
            return True, "equivalence"
        # The config's first steps against a twin run only that long (`gate`'s `exact_steps`).
        twin_abs, _, twin_first = per_step(losses[: len(twin.losses)], twin.losses)
        fields.update(
            exact_against="eager twin",
            twin_max_abs_deviation=twin_abs,
            twin_first_diverging_step=twin_first,
        )
        subject = "graph" if self.config.cuda_graph else "config"
        if twin_first is None:
            reasons.append(f"{subject} replays its eager twin bit for bit")
            return True, "exact+equivalence"
        # Not always our bug: a kernel may compute other bits when captured or on another
        # stream. On an H100 (torch 2.11) BERT's eager graph left its twin by ~1e-6 with SDPA's
        # memory-efficient attention and replayed it bit for bit with the math backend; with a
        # second stream or prefetch it left it from an eager warm-up step whatever the backend,
        # cause not found (benchmarks/diagnose_graph_parity.py --sdpa math;
        # docs/benchmarks/README.md, 2026-11-24).
        cause = (
            "a capture or stream bug, or a kernel whose bits change when captured or on "
            "another stream"
            if self.config.cuda_graph
            else "a stream bug"
        )
        reasons.append(
            f"{subject} does not replay its eager twin bit for bit: first differs at step "
            f"{twin_first} (max |diff| {twin_abs:.2g}), {cause}"
        )
        return False, "exact+equivalence"

    def _within_twin_noise(self, losses: Sequence[float], twin: Twin) -> tuple[bool, GateTest]:
        """A twin run twice with the process's own kernels ("off", where the search ran it
        beside the config's trial, `tuner.search.gating.kept`) that did not reproduce: no bit
        for bit test applies, and the config is held within `TWIN_NOISE_MULTIPLE` times the
        twin's own run-to-run difference instead (`within_twin_noise`)."""
        within, largest, noise = within_twin_noise(losses, twin)
        _, _, first = per_step(losses[: len(twin.losses)], twin.losses)
        self.fields.update(
            exact_against="eager twin's noise",
            twin_max_abs_deviation=largest,
            twin_first_diverging_step=first,
            twin_noise=noise,
        )
        subject = "graph" if self.config.cuda_graph else "config"
        kernels = (
            f"with the process's own kernels its eager twin's two runs differ from step "
            f"{twin.first_difference} (max |diff| {noise or 0.0:.2g}), so no bit for bit test "
            "applies"
        )
        if within:
            self.reasons.append(
                f"{subject} stays within {TWIN_NOISE_MULTIPLE:g}x its eager twin's own "
                f"run-to-run difference (max |diff| {largest:.2g}): {kernels}"
            )
            return True, "exact+equivalence"
        self.reasons.append(
            f"{subject} leaves its eager twin by {largest:.2g}, more than {TWIN_NOISE_MULTIPLE:g}x "
            f"the twin's own run-to-run difference: {kernels}; a capture or stream bug"
        )
        return False, "exact+equivalence"
