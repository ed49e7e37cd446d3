"""Three predictions of what float8 saves in a decoder's linears, beside one measurement: which
probe the `float8_linears` lever can trust (issue 54, "float8 coverage").

    STREAMTUNE_COMMIT=<sha> python benchmarks/float8_blocks.py --presets hf:causal-lm:llama-1b \\
        --model-arg arch=qwen2 ... --model-arg layers=24 --layers 2 --out /tmp/out

At the model's own shapes and tokens a step (forward and backward, bf16 autocast), each figure
float8 minus bf16 in ms a step (negative: float8 saves):
- `per_linear`: each converted linear timed alone (`linear_ms`, the lever's probe before
  2026-12-04), summed over the model's linears;
- `siblings`: the linears that read one input (q/k/v, gate/up) timed together, compiled as one,
  so float8 casts their shared input once, as the whole model compiled does (`sibling_calls` and
  `group_ms`, the lever's probe since);
- `block`: the model (cut to `--layers` layers of the same widths: a library model's `layers`
  argument) compiled whole, once with every linear but the head in float8 and once with none,
  timed as launched, scaled to the model's depth: the casts' fusion with the norms and the
  residual adds is in it.
The whole-step trials of 2026-12-04 (Qwen2-style 0.49B, one H200) ran `float8_linears=none`
2.4-3.2 ms a step slower than `all`, against a per-linear probe of 1.6-1.7 ms faster.
Writes `float8-blocks-<gpu>-<date>[-tag].json` and its Markdown twin. `--device cpu` runs the
bf16 half here (the test of this script; float8 is refused in one line).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import trainers  # noqa: E402
from benchmarks.run_meta import provenance, run_meta, write_record  # noqa: E402
from trainers import float8  # noqa: E402
from trainers.flops import first_batch  # noqa: E402
from trainers.levers.declare import ProbeInput  # noqa: E402
from trainers.levers.float8_linears import (  # noqa: E402
    Shape,
    converted_linears,
    group_ms,
    sibling_calls,
)
from trainers.levers.timing import timed_ms  # noqa: E402


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="hf:causal-lm:llama-1b")
    parser.add_argument("--model-arg", action="append", default=[], help="KEY=VALUE, repeated")
    parser.add_argument(
        "--layers",
        type=int,
        default=None,
        help="the layers of the model compiled whole (its `layers` argument; default: as built)",
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    parser.add_argument("--commit", default=os.environ.get("STREAMTUNE_COMMIT", "unknown"))
    return parser.parse_args(argv)


def build(spec: str, model_args: dict[str, str], device: torch.device) -> Any:
    workload_name, preset = spec.rsplit(":", 1)
    workload = trainers.load_workload(workload_name, preset, seed=0, model_args=model_args)
    workload.model.to(device)
    return workload


def block_ms(workload: Any, value: str, device: torch.device, iters: int) -> float:
    """One step of `workload`'s model compiled whole, its linears in `value` (the head aside)."""
    model = workload.model
    if value == "float8":
        float8.convert(model, float8.Float8Plan.of(model))
    batch = tuple(t.to(device) for t in first_batch(workload))
    compiled = torch.compile(model)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = workload.loss_fn(compiled, batch)
        loss.backward()
        model.zero_grad(set_to_none=True)

    return timed_ms(step, device, warmup=3, iters=iters)


def _difference(figures: dict[str, float | str], times: float) -> float | str:
    f8, bf16 = figures["float8"], figures["bf16"]
    return (f8 - bf16) * times if isinstance(f8, float) and isinstance(bf16, float) else str(f8)


def entry(args: argparse.Namespace, spec: str, device: torch.device) -> dict[str, Any]:
    model_args = dict(kv.split("=", 1) for kv in args.model_arg)
    cut = model_args if args.layers is None else {**model_args, "layers": str(args.layers)}
    # The cut model's layers stand for the whole depth's.
    scale = 1.0 if args.layers is None else int(model_args["layers"]) / args.layers
    unavailable = float8.unavailable(device)
    workload = build(spec, cut, device)
    batch = tuple(t.to(device) for t in first_batch(workload))
    where = ProbeInput(
        forward=lambda: workload.loss_fn(workload.model, batch), device=device, model=workload.model
    )
    calls = sibling_calls(where, converted_linears(workload.model))
    out: dict[str, Any] = {"preset": spec, "model_args": model_args, "scale": scale}
    out["rows"] = next(iter(calls))[1] if calls else 0
    singles: Counter[tuple[Shape, int]] = Counter()
    for (group, n_rows), times in calls.items():
        for shape in group:
            singles[(shape, n_rows)] += times
    started = time.perf_counter()
    out["per_linear"] = [
        _timed([shape], n_rows, times * scale, device, unavailable)
        for (shape, n_rows), times in singles.items()
    ]
    out["per_linear_s"] = round(time.perf_counter() - started, 1)
    torch.compiler.reset()
    started = time.perf_counter()
    out["siblings"] = [
        _timed(list(group), n_rows, times * scale, device, unavailable)
        for (group, n_rows), times in calls.items()
    ]
    out["siblings_s"] = round(time.perf_counter() - started, 1)
    torch.compiler.reset()
    started = time.perf_counter()
    block: dict[str, float | str] = {"bf16": block_ms(workload, "bf16", device, args.iters)}
    torch.compiler.reset()
    block["float8"] = unavailable or block_ms(workload, "float8", device, args.iters)
    torch.compiler.reset()
    out["block"] = {**block, "float8_minus_bf16_ms": _difference(block, scale)}
    out["block_s"] = round(time.perf_counter() - started, 1)
    for way in ("per_linear", "siblings"):
        parts = [g["float8_minus_bf16_ms"] for g in out[way]]
        out[f"{way}_ms"] = sum(parts) if all(isinstance(p, float) for p in parts) else unavailable
    return out


def _timed(
    group: list[Shape], rows: int, times: float, device: torch.device, unavailable: str | None
) -> dict[str, Any]:
    """One group's (or one linear's) figures in bf16 and float8, and their difference a step."""
    figures: dict[str, float | str] = {
        "bf16": group_ms(tuple(group), rows, (False,) * len(group), device)
    }
    figures["float8"] = unavailable or group_ms(tuple(group), rows, (True,) * len(group), device)
    torch.compiler.reset()  # each compiles alone: no recompile limit, no shared guards
    return {
        "group": [list(s) for s in group],
        "rows": rows,
        "times": times,
        **figures,
        "float8_minus_bf16_ms": _difference(figures, times),
    }


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# What float8 saves in a decoder's linears, three ways",
        "",
        provenance(data["meta"]),
        "",
        "Float8 minus bf16, ms a step (negative: float8 saves).",
        "",
        "| preset | rows | per linear | siblings together | the model compiled (scaled by) |",
        "|---|---|---|---|---|",
    ]
    for e in data["presets"]:
        model = " ".join(f"{k}={v}" for k, v in e["model_args"].items())
        lines.append(
            f"| {e['preset']} {model} | {e['rows']} | {_ms(e['per_linear_ms'])} "
            f"| {_ms(e['siblings_ms'])} | {_ms(e['block']['float8_minus_bf16_ms'])} "
            f"({e['scale']:g}) |"
        )
    return "\n".join(lines) + "\n"


def _ms(value: float | str | None) -> str:
    return f"{value:+.2f}" if isinstance(value, float) else str(value)[:80]


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    device = trainers.resolve_device(args.device)
    meta, stem = run_meta(device, "float8_blocks.py", argv, args.commit)
    name = f"float8-blocks-{stem}{f'-{args.tag}' if args.tag else ''}"
    presets = [entry(args, spec.strip(), device) for spec in args.presets.split(",")]
    write_record(args.out, name, {"meta": meta, "presets": presets}, markdown)


if __name__ == "__main__":
    main()
