"""One GPU: every data-parallel lever's code path, proven by a world-size-1 NCCL torchrun launch.

    python benchmarks/ddp_one_gpu.py --commit $(git rev-parse --short HEAD) \\
        --out docs/benchmarks/ddp-one-gpu.json

For each lever setting (DDP with each bucket size, gradient views, static graph; FSDP2 as it
comes, without resharding, with explicit prefetch; `--compiled`: each composed with
torch.compile too) one torchrun launch
of one process on GPU 0 (`trainers.program.run_distributed(nproc=1)`: NCCL, the loop core's DDP
or FSDP2 wrapper, rank 0 reporting through the program protocol) measures `--windows` windows of
`--window-steps` steps. Then the data-parallel gate judges every setting in one more launch
(`tuner.search.gating.dpgate`: the ranks' losses gathered and checked, the losses against the
single-process reference's noise envelope, measured in a child process), and DDP's default is
profiled once (`tuner.search.deciding.dpprofile`: rank 0's trace, the share of NCCL time exposed).

`--nproc N` runs every launch with N processes, one per GPU, for a machine of several GPUs:
then each lever's ms/step and gate verdict are the data-parallel figures themselves.

What this proves (N = 1): the code paths run on a GPU under NCCL and train the same model. What it
cannot: world size 1 has nothing to all-reduce across, so no figure here says what a lever is
worth on several GPUs; that needs a machine of several GPUs (README, "Several GPUs").

Writes the JSON to `--out` after every setting (GPU, driver, CUDA, torch and `--commit`: the
GPU machine has no git). NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 are set in
this process and every launch. About 2-3 minutes on an H100 with the defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import trainers
from benchmarks.run_meta import run_meta
from trainers import LoopConfig, RunArgs
from trainers.program import NCCL_ENV, run_distributed
from tuner.search.deciding.dpprofile import DataParallelProfiler
from tuner.search.gating.dpgate import DataParallelGate

LEVERS: dict[str, dict[str, Any]] = {
    "ddp-bucket-1": {"parallel": "ddp", "bucket_cap_mb": 1},
    "ddp-bucket-5": {"parallel": "ddp", "bucket_cap_mb": 5},
    "ddp-bucket-25": {"parallel": "ddp"},
    "ddp-bucket-100": {"parallel": "ddp", "bucket_cap_mb": 100},
    "ddp-gradient-as-bucket-view": {"parallel": "ddp", "gradient_as_bucket_view": True},
    "ddp-static-graph": {"parallel": "ddp", "static_graph": True},
    "fsdp2": {"parallel": "fsdp2"},
    "fsdp2-no-reshard": {"parallel": "fsdp2", "reshard_after_forward": False},
    "fsdp2-prefetch": {"parallel": "fsdp2", "fsdp_prefetch": True},
}
COMPILED: dict[str, dict[str, Any]] = {
    # With --compiled: the compositions with torch.compile (DDP's graph split at the buckets,
    # FSDP2 around blocks compiled one by one); each compile adds 20 s or more on a cold cache.
    "ddp-compiled": {"parallel": "ddp", "compile": "default"},
    "fsdp2-blocks-compiled": {"parallel": "fsdp2", "compile": "default", "compile_scope": "blocks"},
}
QUICK = ("ddp-bucket-25", "fsdp2-prefetch")


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the JSON file to write")
    parser.add_argument("--commit", default="unknown", help="the commit measured (no git there)")
    parser.add_argument(
        "--nproc",
        type=int,
        default=1,
        help="processes, one per GPU (default 1: the code paths on one GPU; 2 or more on a "
        "machine of several GPUs gives each lever's cost and gate verdict there)",
    )
    parser.add_argument("--workload", default="transformer")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--window-steps", type=int, default=10)
    parser.add_argument("--parity-steps", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help=f"only {', '.join(QUICK)}")
    parser.add_argument("--compiled", action="store_true", help=", ".join(COMPILED) + " too")
    parser.add_argument("--no-gate", action="store_true")
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument(
        "--device",
        default="cuda",
        choices=("cuda", "cpu"),
        help="cpu: the same logic over gloo (for the test of this script; its figures mean "
        "nothing)",
    )
    return parser.parse_args(argv)


def _measure(args: argparse.Namespace, config: LoopConfig, device: torch.device) -> dict[str, Any]:
    started = time.perf_counter()
    result = run_distributed(
        args.workload,
        args.preset,
        config,
        RunArgs(
            steps=args.windows * args.window_steps,
            warmup=max(args.warmup, trainers.min_warmup(config)),
            windows=args.windows,
            device=device,
        ),
        nproc=args.nproc,
        timeout_s=300,
    )
    steps_ms = sorted(w.step_ms for w in result.windows)
    return {
        "ok": True,
        "backend": result.effective["backend"],
        "world_size": result.effective["world_size"],
        "replicas": result.effective["replicas"],
        "ms_per_step_median": steps_ms[len(steps_ms) // 2],
        "ms_per_step_windows": [w.step_ms for w in result.windows],
        "samples_per_s_median": result.samples_per_batch / (steps_ms[len(steps_ms) // 2] / 1e3),
        "peak_memory_bytes": result.peak_memory_bytes,
        "losses_finite": all(x == x and abs(x) != float("inf") for x in result.losses),
        "last_loss": result.losses[-1],
        "seconds": time.perf_counter() - started,
    }


def _gate(
    args: argparse.Namespace, configs: dict[str, LoopConfig], device: torch.device
) -> dict[str, Any]:
    """Every setting's gate verdict: one launch trains them all (`DataParallelGate` batches)."""
    gate = DataParallelGate(
        args.workload,
        args.preset,
        RunArgs(steps=args.parity_steps, seed=0, device=device),
        nproc=args.nproc,
        matmul_precision="highest",
        isolate=device.type == "cuda",
        batch=list(configs.values())[1:],
    )
    found: dict[str, Any] = {}
    envelope: dict[str, Any] | None = None
    try:
        for name, config in configs.items():
            try:
                run = gate.check(config, envelope)
            except Exception as exc:  # noqa: BLE001 - recorded per setting
                found[name] = {"passed": False, "error": f"{type(exc).__name__}: {exc}"[-2000:]}
                continue
            envelope = run.envelope
            verdict = run.verdict
            found[name] = {
                "passed": verdict.passed,
                "ratio": verdict.ratio,
                "max_abs_deviation": verdict.max_abs_deviation,
                "reason": verdict.reason,
                "seconds": run.time,
            }
    finally:
        gate.close()
    return found


def _profile(args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    profiler = DataParallelProfiler(
        args.workload,
        args.preset,
        nproc=args.nproc,
        steps=args.window_steps,
        warmup=args.warmup,
        seed=0,
        device=device,
        matmul_precision="highest",
    )
    prof = profiler(LoopConfig(parallel="ddp"))
    from tuner.evidence.verdicts import verdict

    found = verdict(prof)
    return {
        "config": "ddp-bucket-25",
        "step_ms": prof.step_ms,
        "unprofiled_step_ms": prof.unprofiled_step_ms,
        "gpu_busy_fraction": prof.gpu_busy_fraction,
        "comm_ms_per_step": prof.comm_ms_per_step,
        "comm_exposed_fraction": prof.comm_exposed_fraction,
        "comm_kind": prof.comm_kind,
        "verdict": found.explanation,
    }


def _nccl_version() -> str:
    version = torch.cuda.nccl.version()  # (2, 27, 7) in recent torch, an int in old ones
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _write(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def _record(args: argparse.Namespace, meta: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """The record before any lever ran: what was run, where, with which protocol."""
    return {
        "meta": meta | {"nccl": _nccl_version() if device.type == "cuda" else None},
        "what": f"world size {args.nproc}, {'NCCL' if device.type == 'cuda' else 'gloo'}, one "
        "torchrun launch per setting"
        + (": code paths, not speedups (nothing to all-reduce across)" if args.nproc == 1 else ""),
        "workload": f"{args.workload} {args.preset}",
        "protocol": {
            "warmup": args.warmup,
            "windows": args.windows,
            "window_steps": args.window_steps,
            "parity_steps": args.parity_steps,
        },
        "levers": {},
    }


def main(argv: Sequence[str]) -> int:
    args = _parse(argv)
    for name, value in NCCL_ENV.items():
        os.environ.setdefault(name, value)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(
            "ddp_one_gpu.py needs a CUDA GPU (--device cpu runs its logic over gloo)",
            file=sys.stderr,
        )
        return 2
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    meta, _ = run_meta(device, "ddp_one_gpu.py", argv, args.commit)
    levers = {**LEVERS, **(COMPILED if args.compiled else {})}
    names = QUICK if args.quick else tuple(levers)
    configs = {name: LoopConfig(**levers[name]) for name in names}
    out = Path(args.out)
    record = _record(args, meta, device)
    started = time.perf_counter()
    for name, config in configs.items():
        try:
            record["levers"][name] = {"config": levers[name]} | _measure(args, config, device)
        except Exception as exc:  # noqa: BLE001 - a failed setting is a result too
            record["levers"][name] = {
                "config": levers[name],
                "ok": False,
                "error": str(exc)[-3000:],
            }
        print(name, json.dumps(record["levers"][name])[:300], flush=True)
        _write(out, record)
    if not args.no_gate:
        try:
            record["gate"] = _gate(args, configs, device)
        except Exception:  # noqa: BLE001 - recorded
            record["gate"] = {"error": traceback.format_exc()[-3000:]}
        print("gate", json.dumps(record["gate"])[:600], flush=True)
        _write(out, record)
    if not args.no_profile:
        try:
            record["profile"] = _profile(args, device)
        except Exception:  # noqa: BLE001 - recorded
            record["profile"] = {"error": traceback.format_exc()[-3000:]}
        print("profile", json.dumps(record["profile"]), flush=True)
    record["seconds"] = time.perf_counter() - started
    gate = record.get("gate", {})
    record["all_ok"] = (
        all(v.get("ok") for v in record["levers"].values())
        and "error" not in gate
        and all(v.get("passed") for v in gate.values())
    )
    _write(out, record)
    print(f"wrote {out} in {record['seconds']:.0f} s; all ok: {record['all_ok']}", flush=True)
    return 0 if record["all_ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
