"""Float8 against bf16 on one GPU: ms/step, MFU, peak memory and the converted FLOP share of
each precision under whole-model and per-block compilation.

    python benchmarks/float8_probe.py --commit $(git rev-parse --short HEAD) --out $OUT
    python benchmarks/float8_probe.py --quick --commit ... --out $OUT   # ~2 minutes on an H100

Each row runs through `trainers.run` (the loop the tuner measures, fused AdamW, the feed of
`benchmarks/scale_probe.py`), one after another in one process, from the same initial weights,
in the order bf16 then float8 for each compile scope: a first look, not a comparison with
interleaved rounds and confidence intervals (that is `benchmarks/peers.py`). A row that fails
(out of memory, a refusal such as float8 on a GPU below compute capability 8.9) is recorded with
the error's first line and the probe goes on. MFU is against the dense bf16 peak for both
precisions (`trainers/flops.py`): the model's FLOPs do not change with the precision.

`--quick`: llama-350m cut to 4 layers and 4 x 2048 tokens, 4 timed steps. Writes
`float8-probe-<gpu>-<date>[-tag].json` after every row, and a Markdown twin.
"""

from __future__ import annotations

import os

# Before torch allocates anything, as in the measurements of issue 34 (GPU-FACTS): fewer
# fragmentation failures on the large presets. A value set by the caller is kept.
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")

import argparse
import gc
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import trainers
from benchmarks.run_meta import run_meta
from benchmarks.scale_probe import FEED, PARTS, run_row
from trainers import LoopConfig

# The scale probe's feed and compile scopes: the two probes' rows compare.
SCOPES: dict[str, dict[str, Any]] = {name: PARTS[name] for name in ("eager", "model", "blocks")}
QUICK = {
    "preset": "llama-350m",
    "model_arg": ["layers=4", "batch=4"],
    "steps": 4,
    "warmup": 3,
    "windows": 2,
}


def measure(
    workload: trainers.Workload,
    initial: Mapping[str, torch.Tensor],
    config: LoopConfig,
    precision: str,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """One row: the run's figures, or the first line of what stopped it."""
    workload.model.load_state_dict(initial)
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    torch._dynamo.reset()
    torch.manual_seed(0)
    started = time.perf_counter()
    try:
        result = trainers.run(
            workload,
            config,
            steps=args.steps,
            warmup=max(args.warmup, trainers.min_warmup(config)),
            windows=args.windows,
            device=args.device,
            precision=precision,  # type: ignore[arg-type]
        )
    except torch.cuda.OutOfMemoryError as exc:
        return {"error": "out of memory: " + str(exc).splitlines()[0][:400]}
    except Exception as exc:  # noqa: BLE001 - a row that fails is a result, not the end
        first = (str(exc).splitlines() or [""])[0]
        return {"error": f"{type(exc).__name__}: {first[:600]}"}
    finally:
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    out = result.to_dict()
    fp8 = out["float8"] or {}
    return run_row(out, started) | {
        "converted": fp8.get("converted"),
        "linears": fp8.get("linears"),
        "converted_flop_share": fp8.get("flop_share"),
        "float8_summary": fp8.get("summary"),
        "losses": out["losses"],
    }


def speedups(rows: Mapping[str, Mapping[str, Any]], scopes: Sequence[str]) -> dict[str, float]:
    """bf16 ms / float8 ms at each scope where both ran, and float8's best against bf16's."""

    def ms(name: str) -> float | None:
        row = rows.get(name, {})
        return row.get("median_ms")

    found: dict[str, float] = {}
    for scope in scopes:
        bf16, fp8 = ms(f"bf16-autocast+{scope}"), ms(f"float8+{scope}")
        if bf16 and fp8:
            found[scope] = bf16 / fp8
    best = {p: [m for s in scopes if (m := ms(f"{p}+{s}"))] for p in ("bf16-autocast", "float8")}
    if best["bf16-autocast"] and best["float8"]:
        found["best"] = min(best["bf16-autocast"]) / min(best["float8"])
    return found


def to_markdown(data: Mapping[str, Any]) -> str:
    meta = data["meta"]
    lines = [
        f"# Float8 against bf16 on {data['workload']}:{data['preset']} "
        f"({data['parameters'] / 1e6:.0f}M parameters), {meta['gpu']}",
        "",
        f"Driver {meta['driver']}, CUDA {meta['cuda']}, torch {meta['torch']}, torchao "
        f"{data['torchao']}, commit `{meta['commit']}`, {meta['date']}; command: "
        f"`{meta['command']}`. One run per row through `trainers.run`, in order, not "
        "interleaved; MFU against the dense bf16 peak for both precisions.",
        "",
        "| row | ms/step | tokens/s | MFU | peak GB | converted | FLOP share | compile s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, row in data["rows"].items():
        if "error" in row:
            lines.append(f"| {name} | {row['error'][:160]} | | | | | | |")
            continue
        mfu = "-" if row["mfu"] is None else f"{100 * row['mfu']:.1f} %"
        peak = "-" if not row["peak_memory_bytes"] else f"{row['peak_memory_bytes'] / 1e9:.1f}"
        tokens = "-" if row["tokens_per_s"] is None else f"{row['tokens_per_s']:.0f}"
        share = row["converted_flop_share"]
        converted = "-" if row["converted"] is None else f"{row['converted']} of {row['linears']}"
        lines.append(
            f"| {name} | {row['median_ms']:.1f} | {tokens} | {mfu} | {peak} | {converted} "
            f"| {'-' if share is None else f'{100 * share:.1f} %'} | {row['compile_s']:.1f} |"
        )
    if data["speedups"]:
        lines += ["", "bf16 ms / float8 ms: " + ", ".join(
            f"{scope} {ratio:.3f}x" for scope, ratio in data["speedups"].items()
        )]  # fmt: skip
    return "\n".join(lines) + "\n"


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="hf:causal-lm")
    parser.add_argument("--preset", default="llama-1b")
    parser.add_argument("--model-arg", action="append", default=[], help="KEY=VALUE")
    parser.add_argument("--precisions", default="bf16-autocast,float8")
    parser.add_argument("--scopes", default="model,blocks", help=", ".join(SCOPES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument(
        "--quick", action="store_true", help="; ".join(f"{k}={v}" for k, v in QUICK.items())
    )
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    parser.add_argument("--tag", default="")
    parser.add_argument("--commit", default=os.environ.get("STREAMTUNE_COMMIT", "unknown"))
    args = parser.parse_args(argv)
    if args.quick:
        for key, value in QUICK.items():
            setattr(args, key, value)
    unknown = [s for s in args.scopes.split(",") if s not in SCOPES]
    if unknown:
        parser.error(f"--scopes: unknown {', '.join(unknown)}; allowed {', '.join(SCOPES)}")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse(argv)
    scopes = [s for s in args.scopes.split(",") if s]
    precisions = [p for p in args.precisions.split(",") if p]
    device = trainers.resolve_device(args.device)
    command = sys.argv[1:] if argv is None else list(argv)
    meta, where = run_meta(device, "float8_probe.py", command, args.commit)
    model_args = dict(kv.split("=", 1) for kv in args.model_arg)
    workload = trainers.load_workload(args.workload, args.preset, seed=0, model_args=model_args)
    initial = {k: v.detach().clone() for k, v in workload.model.state_dict().items()}
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"float8-probe-{where}" + (f"-{args.tag}" if args.tag else "")
    path = args.out / f"{stem}.json"
    try:
        import torchao

        torchao_version = str(torchao.__version__)
    except Exception:  # noqa: BLE001 - recorded, and the float8 rows say why they failed
        torchao_version = "not importable"
    data: dict[str, Any] = {
        "meta": meta | {"file": path.name, "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF")},
        "torchao": torchao_version,
        "workload": args.workload,
        "preset": args.preset,
        "model_args": model_args,
        "parameters": sum(p.numel() for p in workload.model.parameters()),
        "steps": args.steps,
        "rows": {},
        "speedups": {},
    }
    for scope in scopes:
        config = LoopConfig.from_dict(FEED | SCOPES[scope])
        for precision in precisions:
            name = f"{precision}+{scope}"
            row = measure(workload, initial, config, precision, args)
            data["rows"][name] = row | {"config": config.to_dict(), "precision": precision}
            data["speedups"] = speedups(data["rows"], scopes)
            shown = {k: v for k, v in row.items() if k not in ("windows_ms", "losses")}
            print(name, json.dumps(shown), flush=True)
            path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
            path.with_suffix(".md").write_text(to_markdown(data), encoding="utf-8")
    return data


if __name__ == "__main__":
    main()
