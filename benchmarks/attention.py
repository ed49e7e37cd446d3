"""The attention lever settled at each model's own shapes: for every preset, the SDPA calls one
forward makes (`trainers.levers.attention.attention_calls`), each value of the `attention` lever
timed forward and backward on them (`time_backends`, CUDA events), the kernel PyTorch's own choice
ran (from a profile of one default call), and the attention time per training step by value.

    STREAMTUNE_COMMIT=$(git rev-parse --short HEAD) python benchmarks/attention.py \\
        --presets hf:causal-lm:llama-1b,transformer:medium --out docs/benchmarks

Writes `attention-<gpu>-<date>[-tag].json` and its Markdown twin. A microbenchmark of one
operation: whole steps (`--fix attention=...` on a trial) decide, since kernels interact with
compile, memory and precision. `--device cpu` runs the same logic on this machine's CPU (the
test of this script; the forced kernels are refused there, the figures mean nothing).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import trainers  # noqa: E402
from benchmarks.run_meta import provenance, run_meta, write_record  # noqa: E402
from trainers.flops import first_batch  # noqa: E402
from trainers.levers.attention import (  # noqa: E402
    ATTENTION,
    AttentionCall,
    attention_calls,
    time_backends,
)
from trainers.precision import make_plan  # noqa: E402

_KERNELS = (("cudnn", "cudnn"), ("flash", "flash"), ("efficient", "efficient"), ("fmha", "fmha"))


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="transformer:medium", help="WORKLOAD:PRESET,...")
    parser.add_argument("--precision", default="bf16-autocast")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    parser.add_argument("--commit", default=os.environ.get("STREAMTUNE_COMMIT", "unknown"))
    return parser.parse_args(argv)


def default_kernel(call: AttentionCall, device: torch.device) -> str | None:
    """Which kernel PyTorch's own choice ran for `call`: the fused-attention kernel's name in a
    profile of one forward and backward (None on a CPU, or where no name says)."""
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        time_backends(call, device, warmup=1, iters=1, values=("default",))
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type.name == "CUDA"]
    for name in names:
        lowered = name.lower()
        for label, needle in _KERNELS:
            if needle in lowered:
                return f"{label}: {name[:120]}"
    return None


def entry(args: argparse.Namespace, spec: str, device: torch.device) -> dict[str, Any]:
    workload_name, preset = spec.rsplit(":", 1)
    workload = trainers.load_workload(workload_name, preset, seed=0)
    model = workload.model.to(device)
    batch = tuple(t.to(device) for t in first_batch(workload))
    plan = make_plan(args.precision, device)

    def forward() -> object:
        with plan.autocast():
            return workload.loss_fn(model, batch)

    calls = attention_calls(forward)
    timed = [time_backends(call, device, iters=args.iters) for call in calls]
    per_step: dict[str, float | None] = {}
    for value in ATTENTION.values():
        # A value that could not run one of the calls has no per-step figure.
        costs = [t[str(value)] for t in timed]
        ran = [c for c in costs if isinstance(c, float)]
        per_step[str(value)] = (
            sum(c * call.calls for c, call in zip(ran, calls, strict=True))
            if calls and len(ran) == len(costs)
            else None
        )
    return {
        "preset": spec,
        "precision": args.precision,
        "calls": [
            dataclasses.asdict(call) | {"ms": t, "default_kernel": default_kernel(call, device)}
            for call, t in zip(calls, timed, strict=True)
        ],
        "attention_ms_per_step": per_step,
    }


def markdown(data: dict[str, Any]) -> str:
    values = [str(v) for v in ATTENTION.values()]
    lines = [
        "# The attention kernel at each model's shapes (forward + backward per training step)",
        "",
        provenance(data["meta"]),
        "",
        "| preset | SDPA calls per forward | default kernel | "
        + " | ".join(f"`{v}` ms" for v in values)
        + " |",
        "|---|---|---|" + "---|" * len(values),
    ]
    for e in data["presets"]:
        per = e["attention_ms_per_step"]
        kernels = sorted({c["default_kernel"] or "-" for c in e["calls"]}) or ["no SDPA call"]
        shown = ["-" if per[v] is None else f"{per[v]:.2f}" for v in values]
        count = sum(c["calls"] for c in e["calls"])
        lines.append(
            f"| {e['preset']} | {count} | {'; '.join(kernels)} | " + " | ".join(shown) + " |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    args = parse(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    device = trainers.resolve_device(args.device)
    meta, stem = run_meta(device, "attention.py", argv, args.commit)
    name = f"attention-{stem}{f'-{args.tag}' if args.tag else ''}"
    data: dict[str, Any] = {
        "meta": meta,
        "cudnn": torch.backends.cudnn.version(),
        "presets": [entry(args, spec.strip(), device) for spec in args.presets.split(",")],
    }
    write_record(args.out, name, data, markdown)


if __name__ == "__main__":
    main()
