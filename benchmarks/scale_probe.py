"""The scale levers one by one on a large preset: ms/step, MFU and peak memory of each config.

    python benchmarks/scale_probe.py --workload hf:causal-lm --preset llama-1b \
        --precision bf16-autocast --configs blocks,model,blocks+selective,blocks+micro2 \
        --out $OUT

Each config runs through `trainers.run` (the loop the tuner measures), one after another in one
process, from the same initial weights; a config that runs out of memory is recorded with the
error's first line and the probe goes on. Not a comparison with interleaved rounds (that is
`benchmarks/peers.py`): a first look at what each lever costs and saves, with the compile time.
Writes `scale-probe-<gpu>-<date>.json` after every config, and a Markdown twin.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import trainers
from benchmarks.run_meta import run_meta
from trainers import LoopConfig

FEED: dict[str, Any] = {
    "num_streams": 2,
    "sync_mode": "event",
    "sync_interval": 10,
    "prefetch_depth": 2,
    "pin_memory": True,
    "non_blocking": True,
    "optimizer": "fused",
}
# Short names for the configs the probe knows: a `+`-joined list of these parts.
PARTS: dict[str, dict[str, Any]] = {
    "eager": {"compile": "none"},
    "model": {"compile": "default", "compile_scope": "model"},
    "blocks": {"compile": "default", "compile_scope": "blocks"},
    "selective": {"activation_checkpointing": "selective"},
    "full": {"activation_checkpointing": "blocks"},
    "half": {"activation_checkpointing": "blocks", "checkpoint_share": 0.5},
    "micro2": {"micro_batches": 2},
    "micro4": {"micro_batches": 4},
    "graph": {"cuda_graph": True},
}


def config_of(name: str) -> LoopConfig:
    values = dict(FEED)
    for part in name.split("+"):
        if part not in PARTS:
            raise SystemExit(f"--configs: unknown part {part!r}; allowed {', '.join(PARTS)}")
        values |= PARTS[part]
    return LoopConfig.from_dict(values)


def probe(
    workload: trainers.Workload,
    initial: Mapping[str, torch.Tensor],
    config: LoopConfig,
    args: argparse.Namespace,
) -> dict[str, Any]:
    workload.model.load_state_dict(initial)
    gc.collect()
    if args.device.startswith("cuda"):
        torch.cuda.empty_cache()
    torch._dynamo.reset()
    torch.manual_seed(0)  # the same random numbers for every config (dropout, if any)
    started = time.perf_counter()
    try:
        result = trainers.run(
            workload,
            config,
            steps=args.steps,
            warmup=max(args.warmup, trainers.min_warmup(config)),
            windows=args.windows,
            device=args.device,
            precision=args.precision or None,
        )
    except torch.cuda.OutOfMemoryError as exc:
        return {"error": "out of memory: " + str(exc).splitlines()[0][:400]}
    except Exception as exc:  # noqa: BLE001 - a config that fails is a result, not the end
        return {"error": f"{type(exc).__name__}: {str(exc)[:600]}"}
    finally:
        gc.collect()
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    out = result.to_dict()
    return run_row(out, started) | {"last_loss": out["losses"][-1] if out["losses"] else None}


def run_row(out: dict[str, Any], started: float) -> dict[str, Any]:
    """A probe's figures of one run (`RunResult.to_dict()`), begun at `started`: speed, MFU,
    peak memory and compile cost (the float8 probe's rows share them)."""
    return {
        "median_ms": out["step_time_ms"]["median"],
        "windows_ms": [w["step_ms"] for w in out["windows"]],
        "mfu": out["mfu"],
        "tflops": out["tflops"],
        "mfu_note": out["mfu_note"],
        "flops_per_step": out["flops_per_step"],
        "peak_memory_bytes": out["peak_memory_bytes"],
        "tokens_per_s": out["tokens_per_s"],
        "compile_s": out["compile_s"],
        "compile_unstable": out["compile_unstable"],
        "wall_s": time.perf_counter() - started,
    }


def to_markdown(data: Mapping[str, Any]) -> str:
    meta = data["meta"]
    lines = [
        f"# Scale levers on {data['workload']}:{data['preset']} ({data['precision']}), "
        f"{meta['gpu']}",
        "",
        f"Driver {meta['driver']}, CUDA {meta['cuda']}, torch {meta['torch']}, commit "
        f"`{meta['commit']}`, {meta['date']}; command: `{meta['command']}`. One run per config "
        "through `trainers.run`, in order, not interleaved; MFU against the dense peak of the "
        "run's precision (`trainers/flops.py`).",
        "",
        "| config | ms/step | tokens/s | MFU | peak GB | compile s |",
        "|---|---|---|---|---|---|",
    ]
    for name, row in data["configs"].items():
        if "error" in row:
            lines.append(f"| {name} | {row['error'][:120]} | | | | |")
            continue
        mfu = "-" if row["mfu"] is None else f"{100 * row['mfu']:.1f} %"
        peak = row["peak_memory_bytes"] / 1e9 if row["peak_memory_bytes"] else 0.0
        lines.append(
            f"| {name} | {row['median_ms']:.1f} | {row['tokens_per_s']:.0f} | {mfu} "
            f"| {peak:.1f} | {row['compile_s']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="hf:causal-lm")
    parser.add_argument("--preset", default="llama-1b")
    parser.add_argument("--model-arg", action="append", default=[])
    parser.add_argument("--precision", default="bf16-autocast")
    parser.add_argument("--configs", default="blocks,model,blocks+selective,blocks+micro2")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    parser.add_argument("--tag", default="")
    parser.add_argument("--commit", default=os.environ.get("STREAMTUNE_COMMIT", "unknown"))
    args = parser.parse_args(argv)
    names = [n for n in args.configs.split(",") if n]
    configs = {name: config_of(name) for name in names}
    device = trainers.resolve_device(args.device)
    meta, where = run_meta(
        device, "scale_probe.py", sys.argv[1:] if argv is None else argv, args.commit
    )
    model_args = dict(kv.split("=", 1) for kv in args.model_arg)
    workload = trainers.load_workload(args.workload, args.preset, seed=0, model_args=model_args)
    initial = {k: v.detach().clone() for k, v in workload.model.state_dict().items()}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"scale-probe-{where}" + (f"-{args.tag}" if args.tag else "")
    path = args.out / f"{stem}.json"
    data: dict[str, Any] = {
        "meta": meta | {"file": path.name},
        "workload": args.workload,
        "preset": args.preset,
        "precision": args.precision,
        "parameters": sum(p.numel() for p in workload.model.parameters()),
        "configs": {},
    }
    for name, config in configs.items():
        row = probe(workload, initial, config, args)
        data["configs"][name] = row | {"config": config.to_dict()}
        print(name, json.dumps({k: v for k, v in row.items() if k != "windows_ms"}), flush=True)
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        path.with_suffix(".md").write_text(to_markdown(data), encoding="utf-8")


if __name__ == "__main__":
    main()
