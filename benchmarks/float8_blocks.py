"""Three predictions of what float8 saves in a decoder's linears, beside one measurement: which
probe the `float8_linears` lever can trust (issue 54, "float8 coverage").

    STREAMTUNE_COMMIT=<sha> python benchmarks/float8_blocks.py --presets hf:causal-lm:llama-1b \\
        --model-arg arch=qwen2 ... --model-arg layers=24 --layers 2 --out /tmp/out

At the model's own shapes and tokens a step (forward and backward, bf16 autocast):
- `per_linear`: each converted linear timed alone (`linear_ms`, the lever's probe today), summed
  over the model's linears: float8 minus bf16;
- `siblings`: the linears that read one input (q/k/v, gate/up) timed together, compiled as one,
  so float8 casts their shared input once, as the whole model compiled does;
- `block`: the model cut to `--layers` decoder layers (the same widths), compiled whole, once
  with every linear but the head in float8 and once with none, timed as launched, scaled to the
  model's depth: the casts' fusion with the norms and the residual adds is in it.
Negative: float8 saves. The whole-step trials of 2026-12-04 (Qwen2-style 0.49B, one H200) ran
`float8_linears=none` 2.4-3.2 ms a step slower than `all`, against a probe of 1.6-1.7 ms faster.
Writes `float8-blocks-<gpu>-<date>[-tag].json` and its Markdown twin.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
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
from trainers.levers.timing import graphed, timed_ms  # noqa: E402


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="hf:causal-lm:llama-1b")
    parser.add_argument("--model-arg", action="append", default=[], help="KEY=VALUE, repeated")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers of the cut model")
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


def sibling_groups(model: nn.Module, batch: Any, loss_fn: Any) -> Counter[tuple[Shape, ...]]:
    """The converted linears grouped by the input tensor they read in one forward."""
    plan = float8.Float8Plan.of(model)
    seen: dict[int, list[Shape]] = {}
    alive: list[torch.Tensor] = []  # held, so that no freed input's id is given to another

    def hook(name: str) -> Callable[..., None]:
        module = model.get_submodule(name)
        dims = float8.linear_dims(module)
        assert dims is not None
        shape = (dims[0], dims[1], getattr(module, "bias", None) is not None)

        def record(_m: nn.Module, args: tuple[Any, ...]) -> None:
            alive.append(args[0])
            seen.setdefault(id(args[0]), []).append(shape)

        return record

    hooks = [model.get_submodule(n).register_forward_pre_hook(hook(n)) for n in plan.converted]
    try:
        with torch.no_grad(), torch.autocast(batch[0].device.type, dtype=torch.bfloat16):
            loss_fn(model, batch)
    finally:
        for h in hooks:
            h.remove()
    return Counter(tuple(group) for group in seen.values())


def group_ms(group: tuple[Shape, ...], rows: int, value: str, device: torch.device) -> float:
    holder = nn.ModuleList(
        nn.Linear(i, o, bias=b, device=device) for i, o, b in group
    )
    if value == "float8":
        names = tuple(str(k) for k in range(len(group)))
        float8.convert(holder, float8.Float8Plan(converted=names, kept=()))
    inputs = torch.randn(rows, group[0][0], device=device, dtype=torch.bfloat16)
    inputs.requires_grad_(True)
    grads = [torch.randn(rows, o, device=device, dtype=torch.bfloat16) for _, o, _ in group]

    def forward(x: torch.Tensor) -> list[torch.Tensor]:
        return [layer(x) for layer in holder]

    run = torch.compile(forward, dynamic=False) if value == "float8" else forward

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16):
            outs = run(inputs)
        torch.autograd.backward(outs, grads)
        inputs.grad = None
        holder.zero_grad(set_to_none=True)

    return timed_ms(graphed(step, device), device, warmup=3, iters=10)


def block_ms(spec: str, model_args: dict[str, str], value: str, device: torch.device, iters: int) -> float:
    workload = build(spec, model_args, device)
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


def entry(args: argparse.Namespace, spec: str, device: torch.device) -> dict[str, Any]:
    model_args = dict(kv.split("=", 1) for kv in args.model_arg)
    depth = int(model_args.get("layers", 0))
    cut = {**model_args, "layers": str(args.layers)}
    scale = depth / args.layers  # the cut model's layers stand for the whole depth's
    workload = build(spec, cut, device)
    batch = tuple(t.to(device) for t in first_batch(workload))
    rows = int(batch[0].numel())
    groups = sibling_groups(workload.model, batch, workload.loss_fn)
    del workload
    out: dict[str, Any] = {"preset": spec, "model_args": model_args, "rows": rows, "depth": depth}
    started = time.perf_counter()
    singles: Counter[Shape] = Counter()
    for group, count in groups.items():
        for shape in group:
            singles[shape] += count
    singles = Counter({s: c * scale for s, c in singles.items()})
    groups = Counter({g: c * scale for g, c in groups.items()})
    per = {s: (linear_ms(s, rows, "bf16", device), linear_ms(s, rows, "float8", device)) for s in singles}
    out["per_linear"] = {
        "shapes": [{"shape": list(s), "count": c, "bf16": per[s][0], "float8": per[s][1]} for s, c in singles.items()],
        "float8_minus_bf16_ms": sum((per[s][1] - per[s][0]) * c for s, c in singles.items()),
        "seconds": round(time.perf_counter() - started, 1),
    }
    torch.compiler.reset()
    started = time.perf_counter()
    rows_out = []
    for group, count in groups.items():
        bf16, f8 = group_ms(group, rows, "bf16", device), group_ms(group, rows, "float8", device)
        rows_out.append({"group": [list(s) for s in group], "count": count, "bf16": bf16, "float8": f8})
        torch.compiler.reset()
    out["siblings"] = {
        "groups": rows_out,
        "float8_minus_bf16_ms": sum((g["float8"] - g["bf16"]) * g["count"] for g in rows_out),
        "seconds": round(time.perf_counter() - started, 1),
    }
    started = time.perf_counter()
    none = block_ms(spec, cut, "bf16", device, args.iters)
    torch.compiler.reset()
    all_ = block_ms(spec, cut, "float8", device, args.iters)
    torch.compiler.reset()
    out["block"] = {
        "layers": args.layers,
        "bf16_ms": none,
        "float8_ms": all_,
        "float8_minus_bf16_ms": (all_ - none) * scale,
        "seconds": round(time.perf_counter() - started, 1),
    }
    return out


def markdown(data: dict[str, Any]) -> str:
    lines = [
        "# What float8 saves in a decoder's linears, three ways (ms a step, negative: float8 saves)",
        "",
        provenance(data["meta"]),
        "",
        "| preset | rows | layers | per linear | siblings together | cut model compiled, scaled |",
        "|---|---|---|---|---|---|",
    ]
    for e in data["presets"]:
        lines.append(
            f"| {e['preset']} {' '.join(f'{k}={v}' for k, v in e['model_args'].items())} "
            f"| {e['rows']} | {e['depth']} | {e['per_linear']['float8_minus_bf16_ms']:+.2f} "
            f"| {e['siblings']['float8_minus_bf16_ms']:+.2f} "
            f"| {e['block']['float8_minus_bf16_ms']:+.2f} ({e['block']['layers']} layers) |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    device = trainers.resolve_device(args.device)
    meta, stem = run_meta(device, "float8_blocks.py", argv, args.commit)
    name = f"float8-blocks-{stem}{f'-{args.tag}' if args.tag else ''}"
    data = {"meta": meta, "presets": [entry(args, s.strip(), device) for s in args.presets.split(",")]}
    write_record(args.out, name, data, markdown)


if __name__ == "__main__":
    main()
