"""The counts of `benchmarks/gate_power.py`, filled model by model and seed by seed (`PowerRun`):
each planted fault judged by the gate (detected or not, by which test), each equivalent config
(passed or not), the noise envelopes and every trajectory; `SeedJudge` is the gate for one model
and seed.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import time
from collections.abc import Sequence
from typing import Any

import torch

from benchmarks.gate_power_models import EQUIVALENT, Equivalent, ModelSpec, load, parse_model_args
from benchmarks.gate_power_probes import probe_entry, time_modes
from trainers import (
    ConfigError,
    LoopConfig,
    RunArgs,
    TrainerError,
    UnsupportedOnDevice,
    fingerprint,
)
from trainers.gate import (
    FAULTS,
    FLOOR_ULPS,
    GATE_DETERMINISM,
    Envelope,
    GateTest,
    ParityVerdict,
    Reproducibility,
    Twin,
    gate,
    judge,
    planted,
    required_test,
    twin_of,
)
from trainers.workloads import WorkloadFactory


def caught_by(verdict: ParityVerdict) -> list[str]:
    """Which of the verdict's tests failed: exact, window (the equivalence test's windows),
    drift (its whole-trajectory drift)."""
    tests = []
    if verdict.exact_against == "eager twin" and verdict.twin_first_diverging_step is not None:
        tests.append("exact")
    if verdict.exact_against == "reference" and verdict.first_diverging_step is not None:
        tests.append("exact")
    if verdict.window_ratio is not None and not verdict.window_ratio <= 1.0:
        tests.append("window")
    if verdict.drift_ratio is not None and not verdict.drift_ratio <= 1.0:
        tests.append("drift")
    return tests


def leave_one_out(envelope: Envelope, window: int, multiple: float) -> list[tuple[float, float]]:
    """Each perturbed run judged against the envelope of the others: the (window, drift) ratios
    a config that differs only by rounding would score (> 1 would be a false rejection)."""
    ratios = []
    for k, perturbed in enumerate(envelope.perturbed):
        others = [p for i, p in enumerate(envelope.perturbed) if i != k]
        eq = judge(perturbed, envelope.reference, others, window=window, multiple=multiple)
        ratios.append((eq.window_ratio, eq.drift_ratio))
    return ratios


class SeedJudge:
    """The gate for one model and seed, with its envelope, the eager twins it needs and the
    reproducibility probe (each measured once, outside any planted fault)."""

    def __init__(
        self,
        power: PowerRun,
        factory: WorkloadFactory,
        spec: ModelSpec,
        seed: int,
        envelope: Envelope,
        probe: Reproducibility | None,
    ) -> None:
        self.args = power.args
        self.factory = factory
        self.seed = seed
        self.envelope = envelope
        self.probe = probe
        self.preset = spec.preset
        self.run_args = RunArgs(
            steps=self.args.steps, seed=seed, device=power.device, precision=spec.precision
        )
        self.twins: dict[str, Twin] = {}

    def twin(self, config: LoopConfig) -> Twin:
        twin_config, capturable = twin_of(config)
        key = json.dumps([twin_config.to_dict(), capturable])
        if key not in self.twins:
            self.twins[key] = Twin.measure(self.factory, config, self.run_args, preset=self.preset)
        return self.twins[key]

    def needs_twin(self, config: LoopConfig, test: GateTest | None) -> bool:
        """Whether the gate compares `config` with its eager twin (not where the probe says the
        exact test cannot apply)."""
        if (test or required_test(config)) != "exact+equivalence":
            return False
        if self.probe is None:
            return True
        return self.probe.reproducible and not (
            config.cuda_graph and self.probe.graph_replays_twin is False
        )

    def warm(self, configs: Sequence[tuple[LoopConfig, GateTest | None]]) -> None:
        """Measure the twins these configs need now, before any fault is planted."""
        for config, test in configs:
            if self.needs_twin(config, test):
                self.twin(config)

    def __call__(self, config: LoopConfig, test: GateTest | None) -> ParityVerdict:
        needs_twin = self.needs_twin(config, test)
        return gate(
            self.factory,
            config,
            self.run_args,
            preset=self.preset,
            envelope=self.envelope,
            twin=self.twin(config) if needs_twin else None,
            test=test,
            multiple=self.args.multiple,
            window=self.args.window,
            probe=self.probe,
        )


class PowerRun:
    """The counts of one benchmark, filled model by model and seed by seed."""

    def __init__(self, args: argparse.Namespace, device: torch.device, meta: dict[str, Any]):
        self.args = args
        self.device = device
        self.meta = meta
        self.cuda = device.type == "cuda"
        self.fingerprint = fingerprint(device)
        self.started = time.perf_counter()
        self.stopped_early = False
        self.faults: dict[str, dict[str, Any]] = {}
        for kind in args.faults:
            fault = FAULTS[kind]
            self.faults[kind] = {
                "description": fault.description,
                "magnitude": fault.magnitude,
                "config": fault.config.to_dict(),
                "test": fault.test or "as the config requires",
                "runs": 0,
                "detected": 0,
                "rate": None,
                "per_model": {},
                "skipped": "CUDA only; this run is on a CPU"
                if fault.cuda_only and not self.cuda
                else None,
            }
        self.equivalent: dict[str, dict[str, Any]] = {}
        self.envelope: dict[str, dict[str, Any]] = {}
        self.models: dict[str, dict[str, Any]] = {}
        self.probes: dict[str, dict[str, dict[str, Any]]] = {}
        self.trajectories: dict[str, dict[str, Any]] = {}
        self.notes: list[str] = []
        self._factories: dict[str, WorkloadFactory] = {}
        self.equivalent_labels: set[str] = set()
        self._gate_probes: dict[str, Reproducibility] = {}

    def seconds(self) -> float:
        return time.perf_counter() - self.started

    # -- one model, once -----------------------------------------------------------------------
    def prepare(self, spec: ModelSpec) -> bool:
        """Load the model and probe its eager step; False if it cannot be loaded."""
        started = time.perf_counter()
        factory = load(spec)
        entry: dict[str, Any] = {
            "workload": spec.name,
            "preset": spec.preset,
            "model_args": spec.model_args,
            "precision": spec.precision,
        }
        if isinstance(factory, str):
            print(f"[gate_power] skipping {spec.label}: cannot load it ({factory})", flush=True)
            self.models[spec.label] = {**entry, "status": "skipped", "reason": factory}
            return False
        self.models[spec.label] = {**entry, "status": "ok", "runs": 0}
        self._factories[spec.label] = factory
        self.envelope[spec.label] = {
            "floor": [],
            "windows": [],
            "loo_window_ratios": [],
            "loo_drift_ratios": [],
            "eps": None,
            "example": None,
        }
        self._probe(spec, factory)
        self.models[spec.label]["seconds"] = time.perf_counter() - started
        return True

    def _probe(self, spec: ModelSpec, factory: WorkloadFactory) -> None:
        """The eager reproducibility probe per precision and determinism mode, timed; the one
        the gate runs under (this model's precision, `GATE_DETERMINISM`) goes to every verdict."""
        rows = self.probes.setdefault(spec.label, {})
        extra = list(self.args.probe_precisions)
        if spec.precision is None and torch.get_float32_matmul_precision() == "highest":
            # The process default computes as fp32 does: probing both would repeat one row.
            extra = [p for p in extra if p != "fp32"]
        precisions = list(dict.fromkeys([spec.precision, *extra]))
        for precision in precisions:
            modes = list(self.args.probe_determinism)
            if precision == spec.precision and GATE_DETERMINISM not in modes:
                modes.append(GATE_DETERMINISM)
            if precision != spec.precision and spec.label not in self.equivalent_labels:
                continue  # a fault model: its own precision's probe is the one that matters
            row = rows.setdefault(str(precision or "default"), {})
            for mode in modes:
                gates = precision == spec.precision and mode == GATE_DETERMINISM
                row[mode], probe = probe_entry(
                    factory, spec, precision, self.device, mode, self.args.steps, capture=gates
                )
                if probe is not None and gates:
                    self._gate_probes[spec.label] = probe
            time_modes(factory, spec, precision, self.device, row)

    # -- one model, one seed -------------------------------------------------------------------
    def seed(self, spec: ModelSpec, seed: int, *, faults: bool, equivalents: bool) -> None:
        factory = self._factories[spec.label]
        envelope = Envelope.measure(
            factory,
            spec.preset,
            RunArgs(steps=self.args.steps, seed=seed, device=self.device, precision=spec.precision),
            perturbations=self.args.perturbations,
        )
        summary = self.envelope[spec.label]
        summary["floor"].append(envelope.floor)
        summary["windows"].append(envelope.windows(self.args.window))
        for window_ratio, drift_ratio in leave_one_out(
            envelope, self.args.window, self.args.multiple
        ):
            summary["loo_window_ratios"].append(window_ratio)
            summary["loo_drift_ratios"].append(drift_ratio)
        summary["eps"] = envelope.eps
        if summary["example"] is None:
            summary["example"] = envelope.to_dict()
        judge_seed = SeedJudge(
            self, factory, spec, seed, envelope, self._gate_probes.get(spec.label)
        )
        chosen = self._configs(faults=faults, equivalents=equivalents)
        planted_here = [
            (FAULTS[k].config, FAULTS[k].test) for k, e in self.faults.items() if not e["skipped"]
        ]
        judge_seed.warm([*(planted_here if faults else []), *((e.config, e.test) for e in chosen)])
        if faults:
            self._faults(spec.label, judge_seed)
        self._equivalents(spec.label, judge_seed, chosen)
        self.models[spec.label]["runs"] += 1
        print(f"[gate_power] {spec.label} seed {seed} done ({self.seconds():.0f} s)", flush=True)

    def _configs(self, *, faults: bool, equivalents: bool) -> list[Equivalent]:
        """Controls where the faults run, the other configs where equivalence is shown."""
        chosen = []
        for eq in EQUIVALENT:
            if eq.cuda_only and not self.cuda:
                continue
            if eq.control_of is not None:
                wanted = (faults and eq.control_of in self.faults) or (
                    equivalents and eq.name in self.args.configs
                )
            else:
                wanted = equivalents and eq.name in self.args.configs
            if wanted:
                chosen.append(eq)
        return chosen

    def _faults(self, label: str, judge_seed: SeedJudge) -> None:
        for kind, entry in self.faults.items():
            if entry["skipped"]:
                continue
            fault = FAULTS[kind]
            per = entry["per_model"].setdefault(
                label,
                {
                    "runs": 0,
                    "detected": 0,
                    "detected_without_drift": 0,
                    "caught_by_exact": 0,
                    "caught_by_window": 0,
                    "caught_by_drift": 0,
                    "exact_skipped": 0,
                    "errors": [],
                    "window_ratios": [],
                    "drift_ratios": [],
                },
            )
            tests: list[str] = []
            try:
                with planted(fault.kind):
                    verdict = judge_seed(fault.config, fault.test)
                detected, tests = not verdict.passed, caught_by(verdict)
                per["window_ratios"].append(verdict.window_ratio)
                per["drift_ratios"].append(verdict.drift_ratio)
                per["exact_skipped"] += int(verdict.exact_skipped is not None)
                self._keep(label, judge_seed, f"fault:{kind}", verdict)
            except (RuntimeError, TrainerError) as exc:
                # The run itself broke (a CUDA error, a failed capture): a fault the gate's
                # caller sees as a failed check.
                detected = True
                per["errors"].append(f"seed {judge_seed.seed}: {type(exc).__name__}: {exc}"[:300])
            per["runs"] += 1
            per["detected"] += int(detected)
            per["detected_without_drift"] += int(
                detected and (not tests or "exact" in tests or "window" in tests)
            )
            for test in ("exact", "window", "drift"):
                per[f"caught_by_{test}"] += int(test in tests)
            entry["runs"] += 1
            entry["detected"] += int(detected)
            entry["rate"] = entry["detected"] / entry["runs"]

    def _equivalents(self, label: str, judge_seed: SeedJudge, chosen: Sequence[Equivalent]) -> None:
        for eq in chosen:
            entry = self.equivalent.setdefault(
                f"{label}/{eq.name}",
                {
                    "config": eq.config.to_dict(),
                    "test": eq.test or "as the config requires",
                    "runs": 0,
                    "passed": 0,
                    "passed_without_drift": 0,
                    "exact_skipped": 0,
                    "window_ratios": [],
                    "drift_ratios": [],
                    "failures": [],
                    "skipped": None,
                },
            )
            if entry["skipped"]:
                continue
            try:
                with (
                    planted(eq.control_of, fault=False)
                    if eq.control_of is not None
                    else contextlib.nullcontext()
                ):
                    verdict = judge_seed(eq.config, eq.test)
            except (ConfigError, UnsupportedOnDevice) as exc:
                if entry["runs"]:
                    raise
                # A config this workload cannot run (an optimizer that takes no fused=...).
                entry["skipped"] = f"{type(exc).__name__}: {exc}"[:300]
                continue
            except (RuntimeError, TrainerError) as exc:
                entry["runs"] += 1
                entry["failures"].append(
                    f"seed {judge_seed.seed}: {type(exc).__name__}: {exc}"[:300]
                )
                continue
            entry["runs"] += 1
            entry["passed"] += int(verdict.passed)
            entry["passed_without_drift"] += int(verdict.passed or caught_by(verdict) == ["drift"])
            entry["exact_skipped"] += int(verdict.exact_skipped is not None)
            entry["window_ratios"].append(verdict.window_ratio)
            entry["drift_ratios"].append(verdict.drift_ratio)
            self._keep(label, judge_seed, eq.name, verdict)
            if not verdict.passed:
                entry["failures"].append(f"seed {judge_seed.seed}: {verdict.reason}"[:300])

    def _keep(self, label: str, judge_seed: SeedJudge, name: str, verdict: ParityVerdict) -> None:
        """Every trajectory goes into the JSON, so other statistics can be tried on them later
        without a GPU."""
        runs = self.trajectories.setdefault(label, {})
        seed = runs.setdefault(
            str(judge_seed.seed),
            {
                "reference": list(judge_seed.envelope.reference),
                "perturbed": [list(p) for p in judge_seed.envelope.perturbed],
                "configs": {},
            },
        )
        seed["configs"][name] = list(verdict.losses)

    # -- output ------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        args = self.args
        return {
            "format": 2,
            "meta": self.meta,
            "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "seconds": self.seconds(),
            "stopped_early": self.stopped_early,
            "commit": self.meta["commit"],
            "fingerprint": self.fingerprint,
            "device": str(self.device),
            "runs": args.runs,
            "fault_runs": args.fault_runs,
            "steps": args.steps,
            "seed": args.seed,
            "precision": args.precision,
            "determinism": GATE_DETERMINISM,
            "model_args": parse_model_args(args.model_arg),
            "statistic": {
                "window": args.window,
                "multiple": args.multiple,
                "floor_ulps": FLOOR_ULPS,
                "perturbations": args.perturbations,
            },
            "models": self.models,
            "faults": self.faults,
            "equivalent": self.equivalent,
            "probes": self.probes,
            "envelope": self.envelope,
            "notes": self.notes,
            "trajectories": self.trajectories,
        }
