"""How well does the parity gate tell broken configs from equivalent ones?

The GPU evidence of issue 28 (one H100, about 5 minutes, nothing compiled):

    python benchmarks/gate_power.py --device cuda --evidence --out docs/benchmarks

`--evidence` is a plan: planted faults on `EVIDENCE_FAULT_MODELS` (each class `--fault-runs` 20
seeds per model), equivalent configs (`EVIDENCE_CONFIGS`) on `EVIDENCE_MODELS` (`--runs` 20 seeds
each: a built-in transformer, BERT `hf:masked-lm`, a Llama-style `hf:causal-lm` in fp32 and in
bf16, a torchvision ResNet-18 and a timm ResNet-10t, all at `tiny` shapes), and the eager
reproducibility probe of every model in fp32 and bf16, with and without deterministic algorithms,
with the eager step's ms/step in each mode. Any flag given as well overrides the plan's value.
`--smoke` is the same plan at CPU size (mlp, 2 seeds, 10 steps), for tests.

Models: `name[@preset][+key=value]...` (the preset defaults to `small` on CUDA, `tiny` on a CPU);
each `key=value` is a library model option (`--model-arg` gives options to every model), except
`precision=...`, that model's precision (default `--precision`). Per model and seed (`--runs`
seeds from `--seed`: new initial weights and data each time), in one process:
0. once per model, before any seed: the eager reproducibility probe (the gate's own, handed to
   every verdict, and the `--probe-determinism` modes at `--probe-precisions`, timed);
1. the reference and its noise envelope (`Envelope.measure`, `--perturbations` runs), and the
   eager twins of the graph configs (`Twin.measure`), outside any planted fault;
2. on the fault models, every planted fault (`trainers.gate.faults`) on the config that exposes
   it, judged by the gate: detected = the verdict failed (or the run raised); and each fault's
   provocation without the fault (the control, which must pass);
3. configs that must pass (`--configs`): passed = the verdict passed.
Seeds go round-robin over the models, so a run stopped by `--max-seconds` or killed leaves every
model with about the same count. CUDA-only faults and graph configs are skipped on a CPU, with a
note. A model that cannot be loaded (its package missing, an unknown name) is skipped with why.

Writes `<name>.json` and `<name>.md` into `--out` (default: $OUT, else the current folder) after
every model and seed; `--name auto` is `gate-<gpu>-<date>`. The JSON's keys: `meta` (GPU, driver,
CUDA, torch, commit, date, command), `faults` (per class: runs, detected, and per model which
test caught each: exact, window, drift, and how often the exact test was skipped), `equivalent`
(per `workload/config`: runs, passed, passed_without_drift), `probes` (per model, precision and
determinism: reproducible, first differing step, max |diff|, eager ms/step), `envelope` (per
model: floors, per-window envelopes, leave-one-out ratios of the perturbed runs), `trajectories`
(every loss trajectory, so other statistics can be tried later without a GPU), `fingerprint`,
`models` (ok or skipped, and why), `statistic`, `notes`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import os
import statistics
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from benchmarks.gate_power_report import markdown, write
from benchmarks.run_meta import run_meta
from trainers import (
    PRECISIONS,
    REFERENCE,
    ConfigError,
    LoopConfig,
    Precision,
    TrainerError,
    UnsupportedOnDevice,
    fingerprint,
    resolve_device,
    resolve_factory,
    run,
)
from trainers.gate import (
    DETERMINISMS,
    FAULT_KINDS,
    FAULTS,
    FLOOR_ULPS,
    GATE_DETERMINISM,
    MULTIPLE,
    PERTURBATIONS,
    WINDOW,
    Determinism,
    Envelope,
    FaultKind,
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
from trainers.gate.reproducibility import measure as measure_reproducibility
from trainers.gate.trajectories import deterministic
from trainers.loop import min_warmup
from trainers.workloads import WorkloadFactory, disable_dropout, lookup

CUDA_MODELS = (
    "transformer@small,convnet@small,mlp@small,torchvision:resnet18,hf:causal-lm,"
    "hf:masked-lm,timm:resnet10t"
)
CPU_MODELS = "mlp,transformer,convnet"

EVIDENCE_MODELS = (
    "transformer@tiny,hf:masked-lm@tiny,hf:causal-lm@tiny+arch=llama+precision=bf16-autocast,"
    "hf:causal-lm@tiny,timm:resnet10t@tiny"
)
EVIDENCE_FAULT_MODELS = "transformer@small,convnet@small"
EVIDENCE_CONFIGS = "graph,2-stream-event"
"""The configs the evidence asks of every model: the eager whole-step graph (exact against its
twin, where the probe says bits can match) and a loop-only config (exact against the
reference). Arithmetic changes (fused, foreach optimizers) are left out to fit 7 minutes."""
EVIDENCE_PROBE_PRECISIONS = "fp32,bf16-autocast"
"""Probed besides each model's own precision (the process default, as fp32, for all but the
bf16 Llama)."""


@dataclasses.dataclass(kw_only=True, frozen=True)
class Equivalent:
    """A config the gate must pass; `test` forces a test (None: the config's own)."""

    name: str
    config: LoopConfig
    cuda_only: bool
    test: GateTest | None = None
    control_of: FaultKind | None = None


_DEFERRED = LoopConfig(sync_interval=10, sync_mode="event", pin_memory=True, non_blocking=True)
EQUIVALENT: tuple[Equivalent, ...] = (
    Equivalent(name="graph", config=_DEFERRED.replace(cuda_graph=True), cuda_only=True),
    Equivalent(
        name="2-stream-event",
        config=_DEFERRED.replace(num_streams=2, prefetch_depth=1),
        cuda_only=False,
    ),
    Equivalent(name="foreach-optimizer", config=LoopConfig(optimizer="foreach"), cuda_only=False),
    Equivalent(name="fused-optimizer", config=LoopConfig(optimizer="fused"), cuda_only=False),
    Equivalent(
        name="graph+fused",
        config=_DEFERRED.replace(cuda_graph=True, optimizer="fused"),
        cuda_only=True,
    ),
    *(
        Equivalent(
            name=f"control:{fault.kind}",
            config=fault.config,
            cuda_only=True,
            test=fault.test,
            control_of=fault.kind,
        )
        for fault in FAULTS.values()
        if fault.provocation
    ),
)


@dataclasses.dataclass(kw_only=True, frozen=True)
class ModelSpec:
    """One model of the benchmark: its label in the results, what builds it, its precision."""

    label: str
    name: str
    preset: str
    model_args: dict[str, str]
    precision: Precision | None


def parse_models(
    spec: str,
    device: torch.device,
    *,
    precision: Precision | None = None,
    model_args: Mapping[str, str] | None = None,
) -> list[ModelSpec]:
    """`name[@preset][+key=value]...,...` -> the models (see the module docstring)."""
    default_preset = "small" if device.type == "cuda" else "tiny"
    models = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        head, *options = item.split("+")
        name, _, preset = head.partition("@")
        preset = preset or default_preset
        own = dict(parse_model_args(options))
        chosen = own.pop("precision", precision)
        if chosen is not None and chosen not in PRECISIONS:
            raise SystemExit(f"--models {item!r}: precision={chosen!r}; allowed {PRECISIONS}")
        label = "+".join([f"{name}@{preset}", *options])
        models.append(
            ModelSpec(
                label=label,
                name=name,
                preset=preset,
                model_args={**(model_args or {}), **own},
                precision=chosen,  # type: ignore[arg-type]
            )
        )
    return models


def load(spec: ModelSpec) -> WorkloadFactory | str:
    """The model's factory (its options bound for a library model), or why it cannot be built."""
    try:
        library = lookup(spec.name) is not None
        factory = resolve_factory(spec.name, spec.model_args if library else None)
        workload = factory(spec.preset, seed=0)
    except Exception as exc:  # noqa: BLE001 - any failure to build skips the model, with its reason
        return f"{type(exc).__name__}: {exc}"
    del workload
    return factory


def parse_model_args(items: Sequence[str]) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, equals, value = item.partition("=")
        if not equals:
            raise SystemExit(f"--model-arg {item!r}: expected key=value")
        pairs[key] = value
    return pairs


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


@contextlib.contextmanager
def determinism_mode(mode: Determinism) -> Iterator[None]:
    """The kernels' settings of a gate run under `mode` (`trainers.gate.trajectories`), for
    timing: warn-only where strict mode would refuse an op without a deterministic version."""
    if mode == "off":
        yield
        return
    with deterministic(strict=False):
        yield


def eager_step_ms(
    factory: WorkloadFactory,
    spec: ModelSpec,
    precision: Precision | None,
    device: torch.device,
    mode: Determinism,
    steps: int,
) -> float:
    """The reference loop's median ms/step under `mode` (dropout off, as in the gate), after 5
    warm-up steps, over 3 windows."""
    workload = factory(spec.preset, seed=0)
    disable_dropout(workload.model)
    with determinism_mode(mode):
        result = run(
            workload,
            REFERENCE,
            steps=max(3, steps),
            warmup=max(5, min_warmup(REFERENCE)),
            windows=3,
            device=device,
            precision=precision,
        )
    return float(result.step_time_ms["median"])


def probe_entry(
    factory: WorkloadFactory,
    spec: ModelSpec,
    precision: Precision | None,
    device: torch.device,
    mode: Determinism,
    steps: int,
    *,
    capture: bool,
) -> tuple[dict[str, Any], Reproducibility | None]:
    """One row of `probes`: the reproducibility probe under `mode` (its time comes later);
    `capture`: the one-stream graph against its eager twin too (on a GPU)."""
    try:
        probe = measure_reproducibility(
            factory,
            spec.preset,
            steps=steps,
            device=device,
            precision=precision,
            determinism=mode,
            capture=capture,
        )
    except (RuntimeError, TrainerError) as exc:
        return {"error": f"{type(exc).__name__}: {exc}"[:300]}, None
    return {**probe.to_dict(), "step_ms": None, "step_ms_rounds": []}, probe


def time_modes(
    factory: WorkloadFactory,
    spec: ModelSpec,
    precision: Precision | None,
    device: torch.device,
    row: dict[str, dict[str, Any]],
    *,
    rounds: int = 2,
) -> None:
    """The eager step's ms/step in each probed mode, interleaved (A B A B) so that clock and load
    drift hit every mode alike; the median of the rounds, and strict's extra ms over off."""
    modes = [mode for mode, entry in row.items() if "error" not in entry]
    for _ in range(rounds):
        for mode in modes:
            try:
                ms = eager_step_ms(factory, spec, precision, device, mode, steps=20)  # type: ignore[arg-type]
            except (RuntimeError, TrainerError) as exc:
                row[mode]["step_ms_error"] = f"{type(exc).__name__}: {exc}"[:300]
                continue
            row[mode]["step_ms_rounds"].append(ms)
    for mode in modes:
        times = row[mode]["step_ms_rounds"]
        row[mode]["step_ms"] = statistics.median(times) if times else None
    if row.get("strict", {}).get("step_ms") and row.get("off", {}).get("step_ms"):
        row["strict"]["extra_ms_vs_off"] = row["strict"]["step_ms"] - row["off"]["step_ms"]


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
        self.common: dict[str, Any] = {
            "preset": spec.preset,
            "seed": seed,
            "device": power.device,
            "precision": spec.precision,
        }
        self.twins: dict[str, Twin] = {}

    def twin(self, config: LoopConfig) -> Twin:
        twin_config, capturable = twin_of(config)
        key = json.dumps([twin_config.to_dict(), capturable])
        if key not in self.twins:
            self.twins[key] = Twin.measure(self.factory, config, self.args.steps, **self.common)
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
            self.args.steps,
            envelope=self.envelope,
            twin=self.twin(config) if needs_twin else None,
            test=test,
            multiple=self.args.multiple,
            window=self.args.window,
            probe=self.probe,
            **self.common,
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
            steps=self.args.steps,
            seed=seed,
            device=self.device,
            perturbations=self.args.perturbations,
            precision=spec.precision,
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


PLANS: dict[str, dict[str, Any]] = {
    "evidence": {
        "models": EVIDENCE_MODELS,
        "fault_models": EVIDENCE_FAULT_MODELS,
        "runs": 20,
        "fault_runs": 10,
        "steps": 20,
        "configs": EVIDENCE_CONFIGS,
        "probe_precisions": EVIDENCE_PROBE_PRECISIONS,
        "probe_determinism": "strict,off",
        "name": "auto",
        "max_seconds": 400.0,
    },
    "smoke": {
        "models": "mlp",
        "fault_models": "mlp",
        "runs": 2,
        "fault_runs": 2,
        "steps": 10,
        "configs": EVIDENCE_CONFIGS,
        "probe_precisions": "",
        "probe_determinism": "strict,off",
        "name": "gate_power",
        "max_seconds": None,
    },
    "default": {
        "models": None,
        "fault_models": None,
        "runs": 20,
        "fault_runs": None,
        "steps": 20,
        "configs": ",".join(e.name for e in EQUIVALENT if e.control_of is None),
        "probe_precisions": "",
        "probe_determinism": GATE_DETERMINISM,
        "name": "gate_power",
        "max_seconds": None,
    },
}
"""Each plan's values for the flags left out (`--evidence`, `--smoke`, neither)."""


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--device", default="auto")
    plan = parser.add_mutually_exclusive_group()
    plan.add_argument("--evidence", action="store_true", help="the GPU evidence plan (issue 28)")
    plan.add_argument("--smoke", action="store_true", help="the evidence plan at CPU size")
    parser.add_argument(
        "--models",
        help=f"name[@preset][+key=value]...,... (default on CUDA: {CUDA_MODELS}; on a CPU: "
        f"{CPU_MODELS}; --evidence: {EVIDENCE_MODELS})",
    )
    parser.add_argument("--fault-models", help="models the faults run on (default: --models)")
    parser.add_argument("--runs", type=int, help="seeds per model for the equivalent configs")
    parser.add_argument("--fault-runs", type=int, help="seeds per fault model (default: --runs)")
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--steps", type=int)
    parser.add_argument("--perturbations", type=int, default=PERTURBATIONS)
    parser.add_argument("--window", type=int, default=WINDOW)
    parser.add_argument("--multiple", type=float, default=MULTIPLE)
    parser.add_argument("--precision", choices=PRECISIONS, default=None)
    parser.add_argument(
        "--faults",
        default=",".join(FAULT_KINDS),
        help=f"comma-separated subset of {', '.join(FAULT_KINDS)}",
    )
    parser.add_argument("--configs", help="comma-separated subset of the configs that must pass")
    parser.add_argument(
        "--probe-precisions", help="precisions to probe besides each model's own (comma-separated)"
    )
    parser.add_argument(
        "--probe-determinism", help=f"determinism modes to probe and time: {DETERMINISMS}"
    )
    parser.add_argument(
        "--max-seconds",
        type=float,
        help="start no new seed after this many seconds (what ran is kept, with a note)",
    )
    parser.add_argument(
        "--model-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of every library model (torchvision:, timm:, hf:)",
    )
    parser.add_argument("--commit", default=None, help="recorded instead of git rev-parse")
    parser.add_argument("--out", default=None, help="output folder (default: $OUT or .)")
    parser.add_argument("--name", help="output file stem; auto: gate-<gpu>-<date>")
    args = parser.parse_args(argv)
    chosen = PLANS["evidence" if args.evidence else "smoke" if args.smoke else "default"]
    for key, value in chosen.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.fault_runs = args.runs if args.fault_runs is None else args.fault_runs
    args.faults = _names(parser, "--faults", args.faults, FAULT_KINDS)
    args.configs = _names(parser, "--configs", args.configs, [e.name for e in EQUIVALENT])
    args.probe_precisions = _names(parser, "--probe-precisions", args.probe_precisions, PRECISIONS)
    args.probe_determinism = _names(
        parser, "--probe-determinism", args.probe_determinism, DETERMINISMS
    )
    return args


def _names(
    parser: argparse.ArgumentParser, flag: str, value: str, allowed: Sequence[str]
) -> list[str]:
    names = [n for n in value.split(",") if n]
    unknown = [n for n in names if n not in allowed]
    if unknown:
        parser.error(f"{flag}: unknown {', '.join(unknown)}; allowed {', '.join(allowed)}")
    return names


def git_commit() -> str:
    import subprocess  # only here: the commit is read once

    root = Path(__file__).resolve().parents[1]
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    # As the tuner's parity child does (tuner/search/isolated.py), before cuBLAS starts: the gate's
    # runs need a fixed cuBLAS workspace to be deterministic across streams.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    device = resolve_device(args.device)
    meta, where = run_meta(
        device, "gate_power.py", sys.argv[1:] if argv is None else argv, args.commit or git_commit()
    )
    name = f"gate-{where}" if args.name == "auto" else args.name
    out = Path(args.out or os.environ.get("OUT") or ".")
    power = PowerRun(args, device, meta)
    if device.type != "cuda":
        power.notes.append(
            "CPU run: the CUDA-only faults (missing-wait, missing-record-stream, "
            "stale-graph-input), the graph configs and the controls are skipped"
        )
    default = CUDA_MODELS if device.type == "cuda" else CPU_MODELS
    common = {"precision": args.precision, "model_args": parse_model_args(args.model_arg)}
    equivalent = parse_models(args.models or default, device, **common)
    at_fault = parse_models(args.fault_models or args.models or default, device, **common)
    roles = {s.label: (s, False, False) for s in [*at_fault, *equivalent]}
    for spec in at_fault:
        roles[spec.label] = (spec, True, False)
    for spec in equivalent:
        roles[spec.label] = (spec, roles[spec.label][1], True)
    power.equivalent_labels = {s.label for s in equivalent}
    ready = []
    for spec, faults, equivalents in roles.values():
        if power.prepare(spec):
            ready.append((spec, faults, equivalents))
        write(power.to_json(), out, name)
    _seeds(power, ready, out, name)
    result = power.to_json()
    write(result, out, name)
    print(markdown(result), flush=True)
    return result


def _seeds(
    power: PowerRun, ready: Sequence[tuple[ModelSpec, bool, bool]], out: Path, name: str
) -> None:
    """Seed after seed, round-robin over the models, each written as soon as it is done."""
    args = power.args
    for index in range(max(args.runs, args.fault_runs)):
        for spec, faults, equivalents in ready:
            do_faults = faults and index < args.fault_runs
            do_equivalents = equivalents and index < args.runs
            if not (do_faults or do_equivalents):
                continue
            if args.max_seconds is not None and power.seconds() > args.max_seconds:
                power.stopped_early = True
                power.notes.append(
                    f"stopped after {power.seconds():.0f} s (--max-seconds {args.max_seconds:g})"
                    f" before seed {args.seed + index} of {spec.label}: counts are what ran"
                )
                return
            power.seed(spec, args.seed + index, faults=do_faults, equivalents=do_equivalents)
            write(power.to_json(), out, name)


if __name__ == "__main__":
    main()
