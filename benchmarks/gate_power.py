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
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gate_power_models import (
    CPU_MODELS,
    CUDA_MODELS,
    EQUIVALENT,
    EVIDENCE_CONFIGS,
    EVIDENCE_FAULT_MODELS,
    EVIDENCE_MODELS,
    EVIDENCE_PROBE_PRECISIONS,
    ModelSpec,
    parse_model_args,
    parse_models,
)
from benchmarks.gate_power_report import markdown, write
from benchmarks.gate_power_run import PowerRun
from benchmarks.run_meta import run_meta
from trainers import PRECISIONS, resolve_device
from trainers.gate import (
    DETERMINISMS,
    FAULT_KINDS,
    GATE_DETERMINISM,
    MULTIPLE,
    PERTURBATIONS,
    WINDOW,
)

# The parts, by responsibility: the models and the configs judged (`gate_power_models`), the
# reproducibility probes (`gate_power_probes`), the counts filled seed by seed (`gate_power_run`),
# the report and merging parts (`gate_power_report`); this file is the plans and the command line.

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
    # As the tuner's parity child does (tuner/search/gating/isolated.py), before cuBLAS starts: the
    # gate's runs need a fixed cuBLAS workspace to be deterministic across streams.
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
