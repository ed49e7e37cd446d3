"""The levers' probes at each preset's own shapes, as a search's second stage runs them
(`trainers.probe_levers`): each probed lever's milliseconds per training step by value, the
seconds each probe took, and what a stage would do with them against a step time given here.

    STREAMTUNE_COMMIT=$(git rev-parse --short HEAD) python benchmarks/lever_probes.py \\
        --presets hf:causal-lm:llama-1b --precision bf16-autocast --step-ms 190 --out /tmp/out

Writes `lever-probes-<gpu>-<date>[-tag].json` and its Markdown twin. A probe predicts one region
of the step; a whole-step trial of the same value (`benchmarks/peers.py --config`, in the same
queue) is what the prediction is checked against. `--device cpu` runs the same logic here (the
test of this script; the CUDA kernels are refused, the figures mean nothing).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import trainers  # noqa: E402
from benchmarks.run_meta import provenance, run_meta, write_record  # noqa: E402
from tuner.search.proposing.predictions import Predictions  # noqa: E402

PROBED = ("attention", "loss")


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="transformer:tiny", help="WORKLOAD:PRESET,...")
    parser.add_argument("--precision", default="bf16-autocast")
    parser.add_argument(
        "--model-arg", action="append", default=[], help="KEY=VALUE of a library model, repeated"
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument(
        "--step-ms",
        type=float,
        default=None,
        help="the leader's step in ms, for what a stage would keep (default: none; no verdicts)",
    )
    parser.add_argument("--tie-margin", type=float, default=0.01, help="the search's default")
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    parser.add_argument("--commit", default=os.environ.get("STREAMTUNE_COMMIT", "unknown"))
    return parser.parse_args(argv)


def entry(args: argparse.Namespace, spec: str, device: Any) -> dict[str, Any]:
    workload_name, preset = spec.rsplit(":", 1)
    model_args = dict(kv.split("=", 1) for kv in args.model_arg)
    workload = trainers.load_workload(workload_name, preset, seed=0, model_args=model_args)
    probed: dict[str, Any] = {}
    seconds: dict[str, float] = {}
    for name in PROBED:
        started = time.perf_counter()
        probed |= trainers.probe_levers(
            workload,
            [name],
            device=device,
            precision=trainers.parse_precision(args.precision),
        )
        seconds[name] = round(time.perf_counter() - started, 2)
    verdicts: dict[str, Any] = {}
    if args.step_ms is not None:
        predictions = Predictions(ms=probed, floor_ms=args.step_ms * args.tie_margin)
        for name in probed:
            default = trainers.LEVERS[name].default
            verdicts[name] = {
                str(value): predictions.gain(name, default, value)
                for value in trainers.LEVERS[name].values()
                if value != default
            }
    return {
        "preset": spec,
        "model_args": model_args,
        "precision": args.precision,
        "ms_per_step": {
            n: {str(v): f for v, f in figures.items()} for n, figures in probed.items()
        },
        "probe_s": seconds,
        "step_ms": args.step_ms,
        "tie_margin": args.tie_margin,
        "stage": verdicts,
    }


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# The levers' probes at each model's shapes (ms per training step by value)",
        "",
        provenance(data["meta"]),
        "",
        "| preset | lever | ms per step by value | probe s | a stage would |",
        "|---|---|---|---|---|",
    ]
    for e in data["presets"]:
        for name, figures in e["ms_per_step"].items():
            shown = (
                ", ".join(
                    f"{v}: {f:.2f}" if isinstance(f, float) else f"{v}: {f[:60]}"
                    for v, f in figures.items()
                )
                or "none of its work in the model"
            )
            stage = e["stage"].get(name, {})
            said = (
                "; ".join(
                    f"{v}: keep ({g:+.2f} ms)" if isinstance(g, float) else f"{v}: {g or 'keep'}"
                    for v, g in stage.items()
                )
                or "-"
            )
            model = " ".join(f"{k}={v}" for k, v in e.get("model_args", {}).items())
            shown_preset = f"{e['preset']} ({model})" if model else e["preset"]
            lines.append(f"| {shown_preset} | {name} | {shown} | {e['probe_s'][name]} | {said} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    device = trainers.resolve_device(args.device)
    meta, stem = run_meta(device, "lever_probes.py", argv, args.commit)
    name = f"lever-probes-{stem}{f'-{args.tag}' if args.tag else ''}"
    data: dict[str, Any] = {
        "meta": meta,
        "presets": [entry(args, spec.strip(), device) for spec in args.presets.split(",")],
    }
    write_record(args.out, name, data, markdown)


if __name__ == "__main__":
    main()
