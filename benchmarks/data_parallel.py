"""Data-parallel tuning on the GPUs of one host, against what a torchrun user writes instead.

    python benchmarks/data_parallel.py --presets transformer:medium --nproc 2 \
        --commit $(git rev-parse --short HEAD) --out docs/benchmarks --tag medium
    python benchmarks/data_parallel.py --presets hf:causal-lm:default --precision bf16-autocast \
        --nproc 2 ...
    python benchmarks/data_parallel.py --presets hf:causal-lm:llama-1b --precision bf16-autocast \
        --peers fsdp2 --nproc 2 ...

Per preset:
1. the default tuning job with `--nproc-per-node N` (`tuner.search.run_study`, every trial a
   torchrun launch of N processes, the baselines DDP's defaults): its wall time, trial counts and
   recommendation, with the job's own speedups over those baselines;
2. the peers, each a LoopConfig launched exactly as a trial is (`trainers.program.run_distributed`,
   N processes, NCCL on GPUs, gloo on a CPU): `ddp` peers are DDP with its defaults (25 MB
   buckets, no static graph) on the PyTorch idiom's loop, and that loop with `torch.compile`;
   `fsdp2` peers are FSDP2's `fully_shard` of each block as it comes, and with each block
   compiled, fused AdamW in both;
3. the recommendation and the peers `--rounds` times, interleaved, each run `--windows` windows:
   ms/step medians with bootstrap CIs, MFU and peak memory, and the recommendation's speedup
   over the fastest peer with its CI;
4. each setting profiled once (`tuner.search.deciding.dpprofile`, rank 0's trace): the share of NCCL
time
   the step leaves exposed, i.e. not hidden under compute (GPUs only: gloo has no kernels).

NCCL_NVLS_ENABLE=0 and TORCH_SYMM_MEM_DISABLE_MULTICAST=1 hold for this process and every launch
(`trainers.program.NCCL_ENV`). Writes `data-parallel-<gpu>-<date>[-<tag>].json` and its Markdown
twin after every preset. `--device cpu` runs the same logic over gloo (for the test of this
script; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

import trainers
from benchmarks.interleaved import ratio_vs_fastest
from benchmarks.run_meta import provenance, run_meta
from trainers import LoopConfig, RunArgs
from trainers.program import NCCL_ENV, run_distributed
from tuner.search.deciding.dpprofile import DataParallelProfiler
from tuner.search.measuring.stats import bootstrap_ci
from tuner.search.options import BASELINES, RunOptions
from tuner.search.study import run_study

_IDIOM = BASELINES["pytorch-default"]
PEERS: dict[str, dict[str, LoopConfig]] = {
    # What a torchrun user writes first, then with the compiler.
    "ddp": {
        "ddp-defaults": _IDIOM.replace(parallel="ddp"),
        "ddp-compile": _IDIOM.replace(parallel="ddp", compile="default"),
    },
    # A sharded model, as FSDP2's docs write it (each block, then the root), fused AdamW; then
    # with each block compiled (torchtitan's order: compile each block, then shard).
    "fsdp2": {
        "fsdp2-defaults": _IDIOM.replace(parallel="fsdp2", optimizer="fused"),
        "fsdp2-blocks-compiled": _IDIOM.replace(
            parallel="fsdp2", optimizer="fused", compile="default", compile_scope="blocks"
        ),
    },
    # The loops a torchrun user would set a tuned job against, in one interleaved run: DDP as
    # written first, DDP with the compiler and fused AdamW, FSDP2 with each block compiled. FSDP2
    # with float8 is refused by the harness (trainers/parallel.py says why), so it has no peer.
    "torchrun": {
        "ddp-defaults": _IDIOM.replace(parallel="ddp"),
        "ddp-compile-fused": _IDIOM.replace(parallel="ddp", compile="default", optimizer="fused"),
        "fsdp2-blocks-compiled": _IDIOM.replace(
            parallel="fsdp2", optimizer="fused", compile="default", compile_scope="blocks"
        ),
    },
}


def tune(spec: str, args: argparse.Namespace, storage: str) -> dict[str, Any]:
    """The default job with `--nproc-per-node N`: its wall time and recommendation."""
    workload, preset = spec.rsplit(":", 1)
    started = time.perf_counter()
    rec = run_study(
        RunOptions(
            workload=workload,
            preset=preset,
            storage=storage,
            study=f"dp-{spec}".replace(":", "-"),
            device=args.device,
            precision=args.precision,
            nproc_per_node=args.nproc,
            model_args=dict(kv.split("=", 1) for kv in args.model_arg),
            trials=args.trials,
            timeout_s=args.search_timeout,
            final_rounds=args.final_rounds,
            # The default job's own: the baselines and the recommendation profiled on GPUs.
            **({} if args.profile is None else {"profile": args.profile}),
        )
    ).to_dict()
    return {
        "wall_s": time.perf_counter() - started,
        "config": rec.get("config"),
        "reason": rec.get("reason"),
        "n_trials": rec.get("trial_counts"),
        "gpu_seconds": rec.get("gpu_seconds"),
        "speedup": rec.get("speedup"),
        "throughput": rec.get("throughput"),
        "parity": rec.get("parity"),
        "verdicts": rec.get("verdicts"),
        "time": rec.get("time"),  # seconds by phase
        "search": rec.get("search"),  # trials predicted, screened out, gated, complete
    }


def _launch(
    spec: str, config: LoopConfig, args: argparse.Namespace, device: torch.device
) -> dict[str, Any]:
    workload, preset = spec.rsplit(":", 1)
    result = run_distributed(
        workload,
        preset,
        config,
        RunArgs(
            steps=args.windows * args.window_steps,
            warmup=max(args.warmup, trainers.min_warmup(config)),
            windows=args.windows,
            device=device,
            precision=args.precision,
        ),
        nproc=args.nproc,
        model_args=dict(kv.split("=", 1) for kv in args.model_arg),
        timeout_s=args.launch_timeout,
    )
    return {
        "windows_ms": [w.step_ms for w in result.windows],
        "peak_memory_bytes": result.peak_memory_bytes,
        "mfu": result.utilisation.mfu,  # None on a CPU or an unknown GPU
        "world_size": result.effective.get("world_size"),
        "backend": result.effective.get("backend"),
    }


def compare(
    spec: str,
    settings: Mapping[str, LoopConfig],
    args: argparse.Namespace,
    device: torch.device,
    log: Callable[[str], None],
) -> dict[str, Any]:
    """Every setting `args.rounds` times, interleaved; medians, CIs and the speedup of
    `recommended` over the fastest peer."""
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in settings}
    errors: dict[str, str] = {}
    for r in range(args.rounds):
        for name, config in settings.items():
            if name in errors and not runs[name]:
                continue  # failed in its first round: it would fail again; keep the rounds short
            try:
                run = _launch(spec, config, args, device)
            except Exception as exc:  # noqa: BLE001 - a setting that fails is a result
                errors[name] = f"{type(exc).__name__}: {exc}"[-2000:]
                log(f"round {r + 1} {name}: failed: {errors[name][:300]}")
                continue
            runs[name].append(run)
            log(f"round {r + 1} {name} {statistics.median(run['windows_ms']):.3f} ms")
    out: dict[str, Any] = {}
    for name, config in settings.items():
        if not runs[name]:
            out[name] = {"config": config.to_dict(), "error": errors.get(name, "not measured")}
            continue
        windows = [w for run in runs[name] for w in run["windows_ms"]]
        peaks = [run["peak_memory_bytes"] for run in runs[name] if run["peak_memory_bytes"]]
        mfus = [run["mfu"] for run in runs[name] if run["mfu"] is not None]
        out[name] = {
            "config": config.to_dict(),
            "median_ms": statistics.median(windows),
            "ci95": list(bootstrap_ci(windows)),
            "windows_ms": windows,
            "mfu": statistics.median(mfus) if mfus else None,
            "peak_memory_bytes": max(peaks) if peaks else None,
            "world_size": runs[name][0]["world_size"],
            "backend": runs[name][0]["backend"],
        } | ({"error_in_a_round": errors[name]} if name in errors else {})
    return out


def speedup_over_fastest_peer(measured: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """`recommended`'s throughput over the fastest measured peer's, with a bootstrap CI."""
    rec = measured.get("recommended", {})
    peers = {n: e for n, e in measured.items() if n != "recommended" and "median_ms" in e}
    if "median_ms" not in rec or not peers:
        return None
    return ratio_vs_fastest(peers, rec)


def comm_exposure(
    spec: str, settings: Mapping[str, LoopConfig], args: argparse.Namespace, device: torch.device
) -> dict[str, Any]:
    """Each setting's profile: how much of its NCCL time the step leaves exposed."""
    if device.type != "cuda":
        return {"skipped": "a CPU run's collectives are gloo host threads: no kernels to overlap"}
    from tuner.evidence.verdicts import verdict

    workload, preset = spec.rsplit(":", 1)
    profiler = DataParallelProfiler(
        workload,
        preset,
        nproc=args.nproc,
        steps=args.window_steps,
        warmup=args.warmup,
        seed=0,
        device=device,
        matmul_precision="highest",
        model_args=dict(kv.split("=", 1) for kv in args.model_arg),
        precision=args.precision,
    )
    found: dict[str, Any] = {}
    for name, config in settings.items():
        try:
            prof = profiler(config)
        except Exception as exc:  # noqa: BLE001 - recorded per setting
            found[name] = {"error": f"{type(exc).__name__}: {exc}"[-1000:]}
            continue
        found[name] = {
            "step_ms": prof.step_ms,
            "comm_ms_per_step": prof.comm_ms_per_step,
            "comm_exposed_fraction": prof.comm_exposed_fraction,
            "gpu_busy_fraction": prof.gpu_busy_fraction,
            "verdict": verdict(prof).explanation,
        }
    return found


def run_preset(
    spec: str,
    args: argparse.Namespace,
    storage: str,
    device: torch.device,
    log: Callable[[str], None],
) -> dict[str, Any]:
    log(f"== {spec}: tuning with {args.nproc} processes")
    tuning = tune(spec, args, storage)
    log(f"recommended {tuning['config']} in {tuning['wall_s']:.0f} s")
    settings = dict(PEERS[args.peers])
    if tuning["config"] is not None:
        settings = {"recommended": LoopConfig.from_dict(tuning["config"])} | settings
    measured = compare(spec, settings, args, device, log)
    return {
        "preset": spec,
        "precision": args.precision,
        "nproc": args.nproc,
        "tuning": tuning,
        "measured": measured,
        "speedup_over_fastest_peer": speedup_over_fastest_peer(measured),
        "comm": comm_exposure(spec, settings, args, device),
    }


def _cell(entry: Mapping[str, Any]) -> str:
    if "median_ms" not in entry:
        return f"failed: {entry.get('error', '')[:120]}"
    low, high = entry["ci95"]
    text = f"{entry['median_ms']:.2f} ({low:.2f}-{high:.2f})"
    if entry.get("mfu") is not None:
        text += f", MFU {100 * entry['mfu']:.1f} %"
    if entry.get("peak_memory_bytes"):
        text += f", {entry['peak_memory_bytes'] / 1e9:.1f} GB"
    return text


def to_markdown(data: Mapping[str, Any]) -> str:
    meta = data["meta"]
    lines = [
        f"# Data-parallel tuning on {meta['gpu']}",
        "",
        provenance(meta, also=f"NCCL {meta.get('nccl')}"),
        "",
        "Median ms/step (95 % CI) over every window of every round, interleaved; each a torchrun "
        "launch of N processes. Exposed: the share of NCCL time not hidden under compute.",
        "",
        "| preset | N | setting | ms/step | exposed comm | tuning wall s |",
        "|---|---|---|---|---|---|",
    ]
    for item in data["presets"]:
        if "error" in item:
            lines.append(f"| {item['preset']} | | failed: {item['error'][:200]} | | | |")
            continue
        for name, entry in item["measured"].items():
            comm = item["comm"].get(name, {})
            exposed = comm.get("comm_exposed_fraction")
            lines.append(
                f"| {item['preset']} | {item['nproc']} | {name} | {_cell(entry)} | "
                f"{'-' if exposed is None else f'{100 * exposed:.0f} %'} | "
                f"{item['tuning']['wall_s']:.0f} |"
            )
        best = item.get("speedup_over_fastest_peer")
        if best:
            lines.append(
                f"| {item['preset']} | {item['nproc']} | recommended / {best['best_peer']} | "
                f"{best['ratio']:.2f}x ({best['ci95'][0]:.2f}-{best['ci95'][1]:.2f}) | | |"
            )
    return "\n".join(lines) + "\n"


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="transformer:medium")
    parser.add_argument("--precision", default=None)
    parser.add_argument("--model-arg", action="append", default=[])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--peers", choices=tuple(PEERS), default="ddp")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--search-timeout", type=float, default=240.0)
    parser.add_argument("--final-rounds", type=int, default=None)
    parser.add_argument(
        "--profile", default=None, help="the tuning job's --profile (default: the job's own)"
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--windows", type=int, default=3)
    parser.add_argument("--window-steps", type=int, default=10)
    parser.add_argument("--launch-timeout", type=float, default=600.0)
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    parser.add_argument("--commit", default=os.environ.get("STREAMTUNE_COMMIT", "unknown"))
    args = parser.parse_args(argv)
    if args.device == "cpu":
        # As `python -m tuner run` does on a CPU: one final round, no profiles (nothing to see).
        args.final_rounds = 1 if args.final_rounds is None else args.final_rounds
        args.profile = "none" if args.profile is None else args.profile
    elif args.final_rounds is None:
        args.final_rounds = RunOptions(workload="w", preset="p").final_rounds
    return args


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    args = _parse(raw)
    for name, value in NCCL_ENV.items():
        os.environ.setdefault(name, value)
    if args.device == "cuda" and torch.cuda.device_count() < args.nproc:
        print(
            f"data_parallel.py: --nproc {args.nproc} needs as many GPUs; "
            f"{torch.cuda.device_count()} here (--device cpu runs its logic over gloo)",
            file=sys.stderr,
        )
        return 2
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    meta, where = run_meta(device, "data_parallel.py", raw, args.commit)
    if device.type == "cuda":
        version = torch.cuda.nccl.version()
        meta["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
    stem = f"data-parallel-{where}" + (f"-{args.tag}" if args.tag else "")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{stem}.json"
    meta["file"] = path.name
    storage = f"sqlite:///{Path(tempfile.mkdtemp(prefix='streamtune-dp-')) / 'dp.db'}"
    data: dict[str, Any] = {"meta": meta, "presets": []}

    def log(text: str) -> None:
        print(text, flush=True)

    for spec in filter(None, args.presets.split(",")):
        try:
            data["presets"].append(run_preset(spec, args, storage, device, log))
        except Exception as exc:  # noqa: BLE001 - one preset's failure must not lose the rest
            log(f"== {spec}: failed: {type(exc).__name__}: {exc}")
            data["presets"].append({"preset": spec, "error": f"{type(exc).__name__}: {exc}"})
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        path.with_suffix(".md").write_text(to_markdown(data), encoding="utf-8")
        log(f"wrote {path}")
    return 0 if all("error" not in p for p in data["presets"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
