"""A default tuning run per preset, timed: the tuner's GPU evidence.

    python benchmarks/tune_presets.py --presets small,medium,large --out docs/benchmarks

Each preset gets `python -m tuner run`'s defaults (40 trials, full space, 3 final rounds) unless
flags say otherwise. Writes `tune-<gpu>-<date>[-<tag>].json` and a Markdown twin: per preset the
recommended config, its speedup over seed-baseline with CI, trials, GPU-seconds, wall time, and
its step time against the CUDA-graph replay floor measured in the same run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from trainers import fingerprint
from tuner.search.options import RunOptions
from tuner.search.study import run_study


def to_markdown(data: dict[str, Any]) -> str:
    meta = data["meta"]
    fp = meta["fingerprint"]
    lines = [
        f"# Default tuning runs on {fp['gpu'] or 'CPU'}",
        "",
        f"Driver {fp['driver']}, CUDA {fp['cuda']}, torch {fp['torch']}; commit "
        f"`{meta['commit']}`; {meta['date']}; float32 matmul precision "
        f"`{meta['matmul_precision']}`; `{meta['command']}`.",
        "",
        "| preset | recommended (source) | speedup vs seed-baseline (95% CI) | vs pytorch-default "
        "| trials complete/failed/pruned | GPU-s | wall s | step ms | graph floor ms "
        "| floor/step | tie |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for preset, entry in data["presets"].items():
        rec = entry["recommendation"]
        if rec.get("config") is None:
            lines.append(f"| {preset} | none: {rec.get('reason')} |" + " |" * 10)
            continue
        cfg = rec["config"]
        short = (
            f"{cfg['num_streams']} streams, {cfg['sync_mode']} every "
            f"{cfg['sync_interval']}, graph {cfg['cuda_graph']}, prefetch "
            f"{cfg['prefetch_depth']}, pin {cfg['pin_memory']}, workers {cfg['num_workers']}"
        )
        sb = rec["speedup"].get("seed-baseline", {})
        pd = rec["speedup"].get("pytorch-default", {})
        n = rec.get("trial_counts") or rec["n_trials"]  # the key until 2026-11-27
        floor = rec.get("floor") or {}
        lines.append(
            f"| {preset} | {short} ({rec['source']}) | {sb.get('median', 0):.2f}x "
            f"({sb['ci95'][0]:.2f}-{sb['ci95'][1]:.2f}) | {pd.get('median', 0):.2f}x "
            f"| {n['complete']}/{n['failed']}/{n['pruned']} | {rec['gpu_seconds']:.0f} "
            f"| {entry['wall_s']:.0f} | {rec['step_ms']:.2f} "
            f"| {floor.get('step_ms', float('nan')):.2f} | {floor.get('ratio', float('nan')):.2f} "
            f"| {'yes' if rec['was_tie'] else 'no'} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workload", default="transformer")
    parser.add_argument("--presets", default="small,medium,large")
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--timeout", type=float, default=None)
    parser.add_argument("--matmul-precision", default="highest")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--storage", default=None)
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    parser.add_argument("--commit", default=os.environ.get("STREAMTUNE_COMMIT", "unknown"))
    args = parser.parse_args()

    device = torch.device("cuda" if torch.cuda.is_available() and args.device != "cpu" else "cpu")
    fp = fingerprint(device)
    date = dt.date.today().isoformat()
    gpu = fp["gpu"].split()[1].lower() if fp["gpu"] else "cpu"
    stem = f"tune-{gpu}-{date}" + (f"-{args.tag}" if args.tag else "")
    args.out.mkdir(parents=True, exist_ok=True)
    storage = args.storage or f"sqlite:///{args.out / (stem + '.db')}"
    data: dict[str, Any] = {
        "meta": {
            "fingerprint": fp,
            "commit": args.commit,
            "date": date,
            "matmul_precision": args.matmul_precision,
            "storage": storage,
            "command": " ".join(["python", "benchmarks/tune_presets.py", *sys.argv[1:]]),
        },
        "presets": {},
    }
    for preset in args.presets.split(","):
        options = RunOptions(
            workload=args.workload,
            preset=preset,
            trials=args.trials,
            timeout_s=args.timeout,
            device=args.device,
            storage=storage,
            matmul_precision=args.matmul_precision,
        )
        started = time.perf_counter()
        rec = run_study(options).to_dict()
        wall = time.perf_counter() - started
        data["presets"][preset] = {"wall_s": wall, "recommendation": rec}
        print(f"{preset}: {rec.get('source')} {rec.get('speedup')} in {wall:.0f} s", flush=True)
        (args.out / f"{stem}.json").write_text(json.dumps(data, indent=1))
        (args.out / f"{stem}.md").write_text(to_markdown(data))
    print(to_markdown(data))


if __name__ == "__main__":
    main()
