"""Reproduce the GPU-FACTS table: the transformer presets under the seed design's settings.

Each setting is run `--repeats` times, interleaved (A B C ... A B C ...), from the same initial
weights, with the GPU-FACTS protocol (Adam, dropout 0.1, `--warmup` untimed steps, `--steps`
timed steps). Writes JSON and a Markdown table; nothing is typed by hand.

    python benchmarks/harness.py --presets small,medium,large --repeats 3 --out docs/benchmarks
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from trainers import LoopConfig, RunArgs, fingerprint, graph_floor, load_workload, run
from tuner.search.measuring.stats import bootstrap_ci

PINNED = {"pin_memory": True, "non_blocking": True}

# (name, description, config, GPU-FACTS median ms for small, medium, large)
SETTINGS: list[tuple[str, str, LoopConfig, tuple[float, float, float]]] = [
    (
        "pytorch-default",
        "PyTorch idiom: 1 stream, sync every step, unpinned",
        LoopConfig(),
        (16.5, 35.5, 41.1),
    ),
    (
        "seed-baseline",
        "seed baseline: 2 streams, synchronize every step",
        LoopConfig(num_streams=2, **PINNED),
        (19.3, 37.6, 40.4),
    ),
    (
        "2s-event10",
        "2 streams, event sync every 10",
        LoopConfig(num_streams=2, sync_mode="event", sync_interval=10, **PINNED),
        (18.5, 34.6, 34.9),
    ),
    (
        "2s-sync10",
        "2 streams, synchronize every 10",
        LoopConfig(num_streams=2, sync_interval=10, **PINNED),
        (19.2, 35.0, 35.7),
    ),
    (
        "2s-event50",
        "2 streams, event every 50",
        LoopConfig(num_streams=2, sync_mode="event", sync_interval=50, **PINNED),
        (16.9, 33.8, 34.8),
    ),
    (
        "3s-event10",
        "3 streams, event every 10",
        LoopConfig(num_streams=3, sync_mode="event", sync_interval=10, **PINNED),
        (17.2, 33.2, 34.8),
    ),
    (
        "4s-event10",
        "4 streams, event every 10",
        LoopConfig(num_streams=4, sync_mode="event", sync_interval=10, **PINNED),
        (17.5, 33.2, 35.2),
    ),
    (
        "cuda-graph",
        "whole step captured in one CUDA graph (1 stream, event every 50)",
        LoopConfig(cuda_graph=True, sync_mode="event", sync_interval=50, **PINNED),
        (2.9, 14.0, 32.8),
    ),
]
PRESET_COLUMN = {"small": 0, "medium": 1, "large": 2}


def measure_preset(
    preset: str, *, repeats: int, steps: int, warmup: int, windows: int
) -> dict[str, Any]:
    workload = load_workload("transformer", preset, seed=0)
    initial = {k: v.detach().clone() for k, v in workload.model.state_dict().items()}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, *_ in SETTINGS}
    floors: list[float] = []
    for repeat in range(repeats):
        workload.model.load_state_dict(initial)
        floors.append(graph_floor(workload, device="cuda").step_ms)
        print(f"{preset:>6} r{repeat} {'graph-floor':<16} {floors[-1]:8.2f} ms/step", flush=True)
        for name, _, config, _ in SETTINGS:
            workload.model.load_state_dict(initial)  # every run starts from the same weights
            gc.collect()
            torch.cuda.empty_cache()
            result = run(
                workload,
                config,
                RunArgs(steps=steps, warmup=warmup, windows=windows, device="cuda"),
            )
            runs[name].append(
                {
                    "repeat": repeat,
                    "step_ms_median": result.step_time_ms["median"],
                    "window_step_ms": [w.step_ms for w in result.windows],
                    "window_gpu_ms": [w.gpu_ms for w in result.windows],
                    "n_syncs": result.n_syncs,
                    "sync_wait_ms": result.sync_wait_ms,
                    "peak_memory_bytes": result.peak_memory_bytes,
                    "final_loss": result.losses[-1],
                }
            )
            print(
                f"{preset:>6} r{repeat} {name:<16} {result.step_time_ms['median']:8.2f} ms/step",
                flush=True,
            )
    settings: dict[str, Any] = {}
    for name, description, config, facts in SETTINGS:
        medians = [r["step_ms_median"] for r in runs[name]]
        low, high = bootstrap_ci(medians)
        settings[name] = {
            "description": description,
            "config": config.to_dict(),
            "step_ms_median": statistics.median(medians),
            "step_ms_min": min(medians),
            "step_ms_max": max(medians),
            "ci95": [low, high],
            "gpu_facts_ms": facts[PRESET_COLUMN[preset]] if preset in PRESET_COLUMN else None,
            "runs": runs[name],
        }
    base = settings["seed-baseline"]["step_ms_median"]
    for entry in settings.values():
        entry["speedup_vs_seed_baseline"] = base / entry["step_ms_median"]
        facts = entry["gpu_facts_ms"]
        entry["ratio_to_gpu_facts"] = entry["step_ms_median"] / facts if facts else None
    floor = statistics.median(floors)
    for entry in settings.values():
        entry["floor_ratio"] = floor / entry["step_ms_median"]
    return {"settings": settings, "graph_floor_ms": {"median": floor, "repeats": floors}}


def to_markdown(data: dict[str, Any]) -> str:
    meta = data["meta"]
    fp = meta["fingerprint"]
    presets = list(data["presets"])
    lines = [
        f"# Harness on {fp['gpu']}: the GPU-FACTS table, measured again",
        "",
        f"GPU {fp['gpu']} (compute {fp['compute_capability']}), driver {fp['driver']}, "
        f"CUDA {fp['cuda']}, torch {fp['torch']}, Python {fp['python']}; commit "
        f"`{meta['commit']}`; {meta['date']}.",
        f"Protocol: transformer presets, Adam, dropout 0.1, {meta['warmup']} warm-up steps, "
        f"{meta['steps']} timed steps in {meta['windows']} windows, {meta['repeats']} repeats "
        "per setting interleaved, each from the same initial weights. Cell: median ms/step over "
        "repeats (min-max of the repeats) / GPU-FACTS median.",
        "",
        "| setting | " + " | ".join(presets) + " |",
        "|---|" + "---|" * len(presets),
    ]
    for name, description, *_ in SETTINGS:
        cells = []
        for preset in presets:
            e = data["presets"][preset]["settings"][name]
            facts = f" / {e['gpu_facts_ms']}" if e["gpu_facts_ms"] else ""
            cells.append(
                f"{e['step_ms_median']:.2f} ({e['step_ms_min']:.2f}-{e['step_ms_max']:.2f}){facts}"
            )
        lines.append(f"| {description} | " + " | ".join(cells) + " |")
    floor_cells = [f"{data['presets'][p]['graph_floor_ms']['median']:.2f}" for p in presets]
    lines.append(
        "| graph replay floor: back-to-back replays, no data, no syncs (GPU time) | "
        + " | ".join(floor_cells)
        + " |"
    )
    lines += [
        "",
        "Speedup over seed-baseline (median of repeats) and floor / step time:",
        "",
        "| setting | " + " | ".join(presets) + " |",
        "|---|" + "---|" * len(presets),
    ]
    for name, *_ in SETTINGS:
        cells = [
            f"{data['presets'][p]['settings'][name]['speedup_vs_seed_baseline']:.2f}x, "
            f"floor {data['presets'][p]['settings'][name]['floor_ratio']:.2f}"
            for p in presets
        ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="small,medium,large")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=15)
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    parser.add_argument("--commit", default=os.environ.get("STREAMTUNE_COMMIT", "unknown"))
    parser.add_argument(
        "--matmul-precision",
        choices=["highest", "high", "medium"],
        default="highest",
        help="torch.set_float32_matmul_precision (high: TF32)",
    )
    parser.add_argument(
        "--floors-only", action="store_true", help="only the CUDA-graph floor of each preset"
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.error("the harness measures a GPU and CUDA is not available here")
    torch.set_float32_matmul_precision(args.matmul_precision)
    if args.floors_only:
        for preset in args.presets.split(","):
            floor = graph_floor(load_workload("transformer", preset, seed=0), device="cuda")
            print(
                f"floor {preset} precision={args.matmul_precision}: {floor.step_ms:.2f} ms "
                f"{[round(x, 2) for x in floor.repeats_ms]}"
            )
        return

    fp = fingerprint(torch.device("cuda"))
    date = dt.date.today().isoformat()
    data: dict[str, Any] = {
        "meta": {
            "fingerprint": fp,
            "commit": args.commit,
            "date": date,
            "steps": args.steps,
            "matmul_precision": args.matmul_precision,
            "warmup": args.warmup,
            "windows": args.windows,
            "repeats": args.repeats,
        },
        "presets": {},
    }
    stem = f"harness-{fp['gpu'].split()[1].lower() if ' ' in fp['gpu'] else 'gpu'}-{date}"
    args.out.mkdir(parents=True, exist_ok=True)
    for preset in args.presets.split(","):
        data["presets"][preset] = measure_preset(
            preset,
            repeats=args.repeats,
            steps=args.steps,
            warmup=args.warmup,
            windows=args.windows,
        )
        # Written after every preset, so a run cut short still leaves its results.
        (args.out / f"{stem}.json").write_text(json.dumps(data, indent=1))
        (args.out / f"{stem}.md").write_text(to_markdown(data))
    print(to_markdown(data))


if __name__ == "__main__":
    main()
