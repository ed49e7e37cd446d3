"""How well does the parity gate tell broken configs from equivalent ones?

    python benchmarks/gate_power.py --device cuda --runs 20 \
        --models transformer@small,convnet@small,mlp@small,torchvision:resnet18 --out "$OUT"

Per model (`name[@preset]`; the preset defaults to `small` on CUDA, `tiny` on a CPU) and per seed
(`--runs` seeds from `--seed`: new initial weights and data each time), in one process:
1. the reference and its noise envelope (`Envelope.measure`, `--perturbations` runs), and the
   eager twins of the graph configs (`Twin.measure`);
2. every planted fault (`trainers.gate.faults`) on the config that exposes it, judged by the gate:
   detected = the verdict failed (or the run raised);
3. configs that must pass: a graph config, a 2-stream event config, the foreach and fused
   optimizers, a graph with the fused optimizer, and on CUDA each fault's provocation without
   the fault (the control); passed = the verdict passed.
CUDA-only faults and graph configs are skipped on a CPU, with a note. A model that cannot be
loaded (its package missing, an unknown name) is skipped with the reason.

Writes `gate_power.json` and `gate_power.md` into `--out` (default: $OUT, else the current
folder), after each model. The JSON's keys: `faults` (per class: runs, detected, and per model
which test caught each: exact, window, drift), `equivalent` (per model and config: runs, passed,
and passed_without_drift: whether it would have passed without the drift test), `envelope` (per
model: floors, per-window envelopes, leave-one-out ratios of the perturbed runs), `trajectories`
(every loss trajectory, so other statistics can be tried later without a GPU), `fingerprint`,
`commit`, `models` (ok or skipped, and why), `statistic`, `notes`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime as dt
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from trainers import (
    PRECISIONS,
    ConfigError,
    LoopConfig,
    Precision,
    TrainerError,
    UnsupportedOnDevice,
    fingerprint,
    resolve_device,
    resolve_factory,
)
from trainers.gate import (
    FAULT_KINDS,
    FAULTS,
    FLOOR_ULPS,
    MULTIPLE,
    PERTURBATIONS,
    WINDOW,
    Envelope,
    FaultKind,
    GateTest,
    ParityVerdict,
    Twin,
    gate,
    judge,
    planted,
    required_test,
    twin_of,
)
from trainers.workloads import WorkloadFactory, lookup

CUDA_MODELS = (
    "transformer@small,convnet@small,mlp@small,torchvision:resnet18,hf:causal-lm,"
    "hf:masked-lm,timm:resnet10t"
)
CPU_MODELS = "mlp,transformer,convnet"


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


def parse_models(spec: str, device: torch.device) -> list[tuple[str, str, str]]:
    """`name[@preset],...` -> [(label, name, preset)]."""
    default_preset = "small" if device.type == "cuda" else "tiny"
    models = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        name, _, preset = item.partition("@")
        preset = preset or default_preset
        models.append((f"{name}@{preset}", name, preset))
    return models


def load(name: str, preset: str, model_args: Mapping[str, str]) -> WorkloadFactory | str:
    """The model's factory (`model_args` bound for a library model), or why it cannot be built."""
    try:
        factory = resolve_factory(name, model_args if lookup(name) is not None else None)
        workload = factory(preset, seed=0)
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
    for k, run in enumerate(envelope.perturbed):
        others = [p for i, p in enumerate(envelope.perturbed) if i != k]
        eq = judge(run, envelope.reference, others, window=window, multiple=multiple)
        ratios.append((eq.window_ratio, eq.drift_ratio))
    return ratios


class SeedJudge:
    """The gate for one model and seed, with its envelope and the eager twins it needs (each
    measured once, outside any planted fault)."""

    def __init__(
        self, power: PowerRun, factory: WorkloadFactory, preset: str, seed: int, envelope: Envelope
    ) -> None:
        self.args = power.args
        self.factory = factory
        self.seed = seed
        self.envelope = envelope
        self.common: dict[str, Any] = {
            "preset": preset,
            "seed": seed,
            "device": power.device,
            "precision": power.args.precision,
        }
        self.twins: dict[str, Twin] = {}

    def twin(self, config: LoopConfig) -> Twin:
        twin_config, capturable = twin_of(config)
        key = json.dumps([twin_config.to_dict(), capturable])
        if key not in self.twins:
            self.twins[key] = Twin.measure(self.factory, config, self.args.steps, **self.common)
        return self.twins[key]

    def __call__(self, config: LoopConfig, test: GateTest | None) -> ParityVerdict:
        needs_twin = (test or required_test(config)) == "exact+equivalence"
        return gate(
            self.factory,
            config,
            self.args.steps,
            envelope=self.envelope,
            twin=self.twin(config) if needs_twin else None,
            test=test,
            multiple=self.args.multiple,
            window=self.args.window,
            **self.common,
        )


class PowerRun:
    """The counts of one benchmark, filled model by model."""

    def __init__(self, args: argparse.Namespace, device: torch.device) -> None:
        self.args = args
        self.device = device
        self.cuda = device.type == "cuda"
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
        self.trajectories: dict[str, dict[str, Any]] = {}
        self.notes: list[str] = []
        self.model_args = parse_model_args(args.model_arg)

    # -- one model ---------------------------------------------------------------------------
    def model(self, label: str, name: str, preset: str) -> None:
        started = time.perf_counter()
        factory = load(name, preset, self.model_args)
        if isinstance(factory, str):
            print(f"[gate_power] skipping {label}: cannot load it ({factory})", flush=True)
            self.models[label] = {
                "workload": name,
                "preset": preset,
                "status": "skipped",
                "reason": factory,
            }
            return
        self.models[label] = {"workload": name, "preset": preset, "status": "ok"}
        summary: dict[str, Any] = {
            "floor": [],
            "windows": [],
            "loo_window_ratios": [],
            "loo_drift_ratios": [],
            "eps": None,
            "example": None,
        }
        self.envelope[label] = summary
        for run in range(self.args.runs):
            seed = self.args.seed + run
            envelope = Envelope.measure(
                factory,
                preset,
                steps=self.args.steps,
                seed=seed,
                device=self.device,
                perturbations=self.args.perturbations,
                precision=self.args.precision,
            )
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
            judge_seed = SeedJudge(self, factory, preset, seed, envelope)
            self._faults(label, judge_seed)
            self._equivalents(label, judge_seed, first=run == 0)
            print(
                f"[gate_power] {label} seed {seed} done ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
        self.models[label]["seconds"] = time.perf_counter() - started

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

    def _equivalents(self, label: str, judge_seed: SeedJudge, *, first: bool) -> None:
        counts = self.equivalent.setdefault(label, {})
        for eq in EQUIVALENT:
            if eq.name not in self.args.configs or (eq.cuda_only and not self.cuda):
                continue
            entry = counts.setdefault(
                eq.name,
                {
                    "config": eq.config.to_dict(),
                    "test": eq.test or "as the config requires",
                    "runs": 0,
                    "passed": 0,
                    "passed_without_drift": 0,
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
                if not first:
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
            "format": 1,
            "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "commit": args.commit or git_commit(),
            "fingerprint": fingerprint(self.device),
            "device": str(self.device),
            "runs": args.runs,
            "steps": args.steps,
            "seed": args.seed,
            "precision": args.precision,
            "model_args": self.model_args,
            "statistic": {
                "window": args.window,
                "multiple": args.multiple,
                "floor_ulps": FLOOR_ULPS,
                "perturbations": args.perturbations,
            },
            "models": self.models,
            "faults": self.faults,
            "equivalent": self.equivalent,
            "envelope": self.envelope,
            "notes": self.notes,
            "trajectories": self.trajectories,
        }


def git_commit() -> str | None:
    root = Path(__file__).resolve().parents[1]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _fmt(values: Sequence[float | None], pick: Callable[[list[float]], float]) -> str:
    finite = [v for v in values if v is not None and math.isfinite(v)]
    infinite = any(v is not None and not math.isfinite(v) for v in values)
    if not finite:
        return "inf" if infinite else "-"
    return f"{pick(finite):.3g}"


def markdown(result: dict[str, Any]) -> str:
    fp = result["fingerprint"]
    stat = result["statistic"]
    lines = [
        "# Parity gate: detection power",
        "",
        f"{fp.get('gpu') or 'CPU'}, torch {fp['torch']}, CUDA {fp['cuda']}, commit "
        f"{result['commit']}, {result['runs']} seeds x {result['steps']} steps, precision "
        f"{result['precision'] or 'process default'}; window {stat['window']} steps, multiple "
        f"{stat['multiple']:g}, floor {stat['floor_ulps']} ulps, {stat['perturbations']} "
        "perturbations.",
        "",
        "| fault | magnitude | runs | detected | rate | by exact | by window | by drift | "
        "detected without the drift test |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, f in result["faults"].items():
        if f["skipped"]:
            lines.append(f"| {kind} | {f['magnitude']} | - | - | skipped: {f['skipped']} | | | | |")
            continue
        by = {
            key: sum(p[key] for p in f["per_model"].values())
            for key in (
                "caught_by_exact",
                "caught_by_window",
                "caught_by_drift",
                "detected_without_drift",
            )
        }
        rate = "-" if f["rate"] is None else f"{f['rate']:.0%}"
        lines.append(
            f"| {kind} | {f['magnitude']} | {f['runs']} | {f['detected']} | {rate} | "
            f"{by['caught_by_exact']} | {by['caught_by_window']} | {by['caught_by_drift']} | "
            f"{by['detected_without_drift']} |"
        )
    lines += [
        "",
        "| model | config (must pass) | runs | passed | passed without the drift test | "
        "max window ratio | max drift ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, configs in result["equivalent"].items():
        for name, e in configs.items():
            if e["skipped"]:
                lines.append(f"| {label} | {name} | - | - | skipped: {e['skipped'][:80]} | | |")
                continue
            lines.append(
                f"| {label} | {name} | {e['runs']} | {e['passed']} | {e['passed_without_drift']} "
                f"| {_fmt(e['window_ratios'], max)} | {_fmt(e['drift_ratios'], max)} |"
            )
    lines += [
        "",
        "| model | status | median floor | median last-window envelope | "
        "max leave-one-out window ratio | max leave-one-out drift ratio |",
        "|---|---|---|---|---|---|",
    ]
    for label, m in result["models"].items():
        env = result["envelope"].get(label)
        if m["status"] != "ok" or env is None:
            lines.append(f"| {label} | {m['status']}: {m.get('reason', '')[:80]} | | | | |")
            continue
        last = [w[-1] for w in env["windows"] if w]
        lines.append(
            f"| {label} | ok | {_fmt(env['floor'], statistics.median)} | "
            f"{_fmt(last, statistics.median)} | {_fmt(env['loo_window_ratios'], max)} | "
            f"{_fmt(env['loo_drift_ratios'], max)} |"
        )
    if result["notes"]:
        lines += ["", *[f"- {note}" for note in result["notes"]]]
    return "\n".join(lines) + "\n"


def write(result: dict[str, Any], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "gate_power.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (out / "gate_power.md").write_text(markdown(result))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto")
    parser.add_argument(
        "--models",
        default=None,
        help=f"name[@preset],... (default on CUDA: {CUDA_MODELS}; on a CPU: {CPU_MODELS})",
    )
    parser.add_argument("--runs", type=int, default=20, help="seeds per model")
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--perturbations", type=int, default=PERTURBATIONS)
    parser.add_argument("--window", type=int, default=WINDOW)
    parser.add_argument("--multiple", type=float, default=MULTIPLE)
    parser.add_argument("--precision", choices=PRECISIONS, default=None)
    parser.add_argument(
        "--faults",
        default=",".join(FAULT_KINDS),
        help=f"comma-separated subset of {', '.join(FAULT_KINDS)}",
    )
    parser.add_argument(
        "--configs",
        default=",".join(e.name for e in EQUIVALENT),
        help="comma-separated subset of the configs that must pass",
    )
    parser.add_argument(
        "--model-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of the library models (torchvision:, timm:, hf:)",
    )
    parser.add_argument("--commit", default=None, help="recorded instead of git rev-parse")
    parser.add_argument("--out", default=None, help="output folder (default: $OUT or .)")
    args = parser.parse_args(argv)
    args.faults = [k for k in args.faults.split(",") if k]
    unknown = [k for k in args.faults if k not in FAULTS]
    if unknown:
        parser.error(f"--faults: unknown {', '.join(unknown)}")
    args.configs = [c for c in args.configs.split(",") if c]
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    device = resolve_device(args.device)
    precision: Precision | None = args.precision
    args.precision = precision
    out = Path(args.out or os.environ.get("OUT") or ".")
    power = PowerRun(args, device)
    if device.type != "cuda":
        power.notes.append(
            "CPU run: the CUDA-only faults (missing-wait, missing-record-stream, "
            "stale-graph-input), the graph configs and the controls are skipped"
        )
    for label, name, preset in parse_models(
        args.models or (CUDA_MODELS if device.type == "cuda" else CPU_MODELS), device
    ):
        power.model(label, name, preset)
        write(power.to_json(), out)
    result = power.to_json()
    write(result, out)
    print(markdown(result), flush=True)
    return result


if __name__ == "__main__":
    main()
