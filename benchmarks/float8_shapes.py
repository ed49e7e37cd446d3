"""Float8 against bf16 for each linear shape a model's float8 run converts, at the model's own
tokens per step: which of its linears float8 pays for (issue 54, "float8 coverage").

    STREAMTUNE_COMMIT=$(git rev-parse --short HEAD) python benchmarks/float8_shapes.py \\
        --presets hf:causal-lm:llama-1b --model-arg seq=2048 --model-arg batch=8 --out /tmp/out

For every distinct (in, out, bias) among the linears `trainers.float8.Float8Plan` converts (an
`nn.Linear` or a Hugging Face `Conv1D`), one copy in bf16 and one converted to float8 (the
run's own conversion, `trainers.float8.convert`) and compiled on its own (`dynamic=False`, as
the whole model compiled fuses float8's casts; the record of 2026-11-30 compiled the bf16 copy
too, which runs the same matmuls), forward and backward under bf16 autocast
on an input of the step's tokens (`batch x seq`: the first batch's first tensor), CUDA events
on the step captured in a CUDA graph (`trainers.levers.float8_linears.linear_ms`, the timing of
that lever's probe; `--launched` times it as launched too, as the records of 2026-11-30 did,
which a small layer's launches dominated). Per shape: ms by
value, and times the count of such layers, ms a step. A microbenchmark of one matmul each: the
casts' fusion with the kernels around each layer, which the whole step compiled gets, is not in
it, so a whole-step trial decides (the `float8_linears` lever's).
Writes `float8-shapes-<gpu>-<date>[-tag].json` and its Markdown twin. `--device cpu` runs the
bf16 half here (the test of this script; float8 is refused in one line, the figures mean
nothing).
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
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import trainers  # noqa: E402
from benchmarks.run_meta import provenance, run_meta, write_record  # noqa: E402
from trainers import float8  # noqa: E402
from trainers.flops import first_batch  # noqa: E402
from trainers.levers.float8_linears import Shape, linear_ms  # noqa: E402


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="transformer:tiny", help="WORKLOAD:PRESET,...")
    parser.add_argument(
        "--model-arg", action="append", default=[], help="KEY=VALUE of a library model, repeated"
    )
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument(
        "--launched",
        action="store_true",
        help="also time each step as launched, not captured in a CUDA graph (the records of "
        "2026-11-30 were): the host's launch time beside the GPU's",
    )
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    parser.add_argument("--commit", default=os.environ.get("STREAMTUNE_COMMIT", "unknown"))
    return parser.parse_args(argv)


def shapes(model: nn.Module) -> Counter[Shape]:
    """How many of the linears a float8 run converts have each (in, out, bias)."""
    plan = float8.Float8Plan.of(model)
    found: Counter[Shape] = Counter()
    for name in plan.converted:
        module = model.get_submodule(name)
        dims = float8.linear_dims(module)
        assert dims is not None  # the plan converts linears only
        found[(dims[0], dims[1], getattr(module, "bias", None) is not None)] += 1
    return found


def tokens(batch: Sequence[Any]) -> int:
    """Tokens (rows of every linear's input) a step's batch gives: its first tensor's elements."""
    first = next(t for t in batch if isinstance(t, torch.Tensor))
    return int(first.numel())


def entry(args: argparse.Namespace, spec: str, device: torch.device) -> dict[str, Any]:
    workload_name, preset = spec.rsplit(":", 1)
    model_args = dict(kv.split("=", 1) for kv in args.model_arg)
    workload = trainers.load_workload(workload_name, preset, seed=0, model_args=model_args)
    rows = tokens(first_batch(workload))
    found = shapes(workload.model)
    unavailable = float8.unavailable(device)
    measured = []
    for shape, count in sorted(found.items(), key=lambda kv: -kv[0][0] * kv[0][1]):
        started = time.perf_counter()
        figures: dict[str, float | str] = {
            "bf16": linear_ms(shape, rows, "bf16", device, args.iters)
        }
        figures["float8"] = unavailable or linear_ms(shape, rows, "float8", device, args.iters)
        launched: dict[str, float | str] = {}
        if args.launched:
            launched["bf16"] = linear_ms(shape, rows, "bf16", device, args.iters, graph=False)
            launched["float8"] = unavailable or linear_ms(
                shape, rows, "float8", device, args.iters, graph=False
            )
        bf16_ms, float8_ms = figures["bf16"], figures["float8"]
        measured.append(
            {
                "in": shape[0],
                "out": shape[1],
                "bias": shape[2],
                "count": count,
                "ms": figures,
                **({"ms_launched": launched} if launched else {}),
                "speedup": bf16_ms / float8_ms if isinstance(float8_ms, float) else None,
                "step_ms_saved": (bf16_ms - float8_ms) * count
                if isinstance(float8_ms, float)
                else None,
                "seconds": round(time.perf_counter() - started, 1),
            }
        )
        torch.compiler.reset()  # each shape compiles alone: no recompile limit, no shared guards
    return {"preset": spec, "model_args": model_args, "rows": rows, "shapes": measured}


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# Float8 against bf16 for each linear shape a float8 run converts (forward + backward)",
        "",
        provenance(data["meta"]),
        "",
        "| preset | rows | in x out (bias) | layers | bf16 ms | float8 ms | speedup "
        "| ms a step saved |",
        "|---|---|---|---|---|---|---|---|",
    ]
    launched = any("ms_launched" in s for e in data["presets"] for s in e["shapes"])
    if launched:
        lines[-2] += " bf16 ms as launched | float8 ms as launched |"
        lines[-1] += "---|---|"
    for e in data["presets"]:
        model = " ".join(f"{k}={v}" for k, v in e["model_args"].items())
        shown = f"{e['preset']} ({model})" if model else e["preset"]
        for s in e["shapes"]:
            f8 = s["ms"]["float8"]
            tail = ""
            if launched:
                both = s.get("ms_launched", {})
                tail = "".join(f" {_ms(both.get(v, '-'))} |" for v in ("bf16", "float8"))
            lines.append(
                f"| {shown} | {e['rows']} | {s['in']} x {s['out']}{' (bias)' if s['bias'] else ''}"
                f" | {s['count']} | {s['ms']['bf16']:.3f} | "
                + (f"{f8:.3f}" if isinstance(f8, float) else f8[:80])
                + " | "
                + ("-" if s["speedup"] is None else f"{s['speedup']:.2f}x")
                + " | "
                + ("-" if s["step_ms_saved"] is None else f"{s['step_ms_saved']:+.2f}")
                + " |"
                + tail
            )
    return "\n".join(lines) + "\n"


def _ms(value: float | str) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)[:80]


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    device = trainers.resolve_device(args.device)
    meta, stem = run_meta(device, "float8_shapes.py", argv, args.commit)
    name = f"float8-shapes-{stem}{f'-{args.tag}' if args.tag else ''}"
    data: dict[str, Any] = {
        "meta": meta,
        "presets": [entry(args, spec.strip(), device) for spec in args.presets.split(",")],
    }
    write_record(args.out, name, data, markdown)


if __name__ == "__main__":
    main()
