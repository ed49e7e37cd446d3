"""The gate's judgement of one config in another precision than the study's, alone: what a tuning
job that may choose that precision runs for each such trial
(`tuner.search.gating.gate.InProcessGate`, the study's reference and its seed-to-seed envelope
measured first), with the verdict, the envelope and the seconds of each part recorded.

    python benchmarks/precision_gate.py --workload hf:causal-lm --preset llama-1b-large \\
        --precision bf16-autocast --config-precision float8 \\
        --config '{"compile": "default", "optimizer": "fused", "compile_scope": "model"}' \\
        --parity-steps 20 --precision-parity-steps 200 --commit $SHA --out $OUT --tag large

For a preset whose whole job does not fit the time a GPU is lent (on llama-1b-large the reference
does not fit without recomputation, and the envelope alone is five 200-step runs of it):
`benchmarks/peers.py --config ... --config-precision ...` measures the same config's speed.
Writes `precision-gate-<gpu>-<date>[-tag].json` and a Markdown twin.
"""

from __future__ import annotations

import os

# As the tuner's GPU worker runs (fewer fragmentation failures on the large presets); a value
# set by the caller is kept.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trainers
from benchmarks.run_meta import run_meta
from trainers.gate import MULTIPLE, PARITY_STEPS
from tuner.search.gating.gate import CrossPrecision, InProcessGate

SHOWN = (
    "passed",
    "test",
    "steps",
    "exact_steps",
    "deviation",
    "envelope",
    "bound",
    "multiple",
    "ratio",
    "decisive_steps",
    "drift_ratio",
    "twin_max_abs_deviation",
    "determinism",
    "reference_determinism",
)


def judge(args: argparse.Namespace, device: Any) -> dict[str, Any]:
    """Run the gate on `args.config` in `args.config_precision`; the record's body."""
    try:
        config = trainers.LoopConfig.from_dict(json.loads(args.config))
    except (ValueError, TypeError) as exc:
        raise SystemExit(f"--config: {exc}") from None
    model_args = dict(kv.split("=", 1) for kv in args.model_arg)
    gate = InProcessGate(
        args.workload,
        args.preset,
        trainers.RunArgs(steps=args.parity_steps, seed=0, device=device, precision=args.precision),
        model_args=model_args,
        cross=CrossPrecision(steps=args.precision_parity_steps, multiple=args.precision_tolerance),
    )
    started = time.perf_counter()
    run = gate.check(config, None, precision=args.config_precision)
    verdict = run.verdict.to_dict()
    return {
        "workload": args.workload,
        "preset": args.preset,
        "model_args": model_args,
        "precision": args.precision,
        "config_precision": args.config_precision,
        "config": config.to_dict(),
        "verdict": verdict,
        "envelope": run.envelope,
        "time": run.time,
        "wall_s": time.perf_counter() - started,
    }


def to_markdown(data: Mapping[str, Any]) -> str:
    meta, verdict = data["meta"], data["verdict"]
    env = data["envelope"]
    lines = [
        f"# The gate on {data['workload']}:{data['preset']} in {data['config_precision']} "
        f"against {data['precision']}, {meta['gpu']}",
        "",
        f"Driver {meta['driver']}, CUDA {meta['cuda']}, torch {meta['torch']}, commit "
        f"`{meta['commit']}`, {meta['date']}; command: `{meta['command']}`.",
        "",
        f"Config: `{json.dumps(data['config'])}`.",
        "",
        f"Envelope: {env['spread']}, {len(env['perturbed'])} runs around the reference, "
        f"{env['steps']} steps, in {env['precision']}, strict determinism {env['strict']}; "
        f"floor {env['floor']:.3g}.",
        "",
        "| field | value |",
        "|---|---|",
        *(f"| {name} | {verdict.get(name)} |" for name in SHOWN),
        f"| reason | {verdict['reason']} |",
        "",
        "| part | seconds |",
        "|---|---|",
        *(f"| {part} | {seconds:.0f} |" for part, seconds in data["time"].items()),
        f"| all | {data['wall_s']:.0f} |",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", required=True)
    parser.add_argument("--preset", required=True)
    parser.add_argument("--model-arg", action="append", default=[])
    parser.add_argument("--device", default="auto")
    parser.add_argument("--precision", required=True, choices=trainers.PRECISIONS)
    parser.add_argument("--config-precision", required=True, choices=trainers.PRECISIONS)
    parser.add_argument("--config", required=True, help="the LoopConfig judged (JSON)")
    parser.add_argument("--parity-steps", type=int, default=PARITY_STEPS)
    parser.add_argument("--precision-parity-steps", type=int, default=200)
    parser.add_argument("--precision-tolerance", type=float, default=MULTIPLE)
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    parser.add_argument("--commit", default=os.environ.get("STREAMTUNE_COMMIT", "unknown"))
    args = parser.parse_args(argv)
    device = trainers.resolve_device(args.device)
    command = sys.argv[1:] if argv is None else list(argv)
    meta, where = run_meta(device, "precision_gate.py", command, args.commit)
    stem = f"precision-gate-{where}" + (f"-{args.tag}" if args.tag else "")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{stem}.json"
    meta["file"] = path.name
    data = {"meta": meta, **judge(args, device)}
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    path.with_suffix(".md").write_text(to_markdown(data), encoding="utf-8")
    print(to_markdown(data), flush=True)


if __name__ == "__main__":
    main()
