"""The benchmark suite: the tuner against an exhaustive grid and the CUDA-graph floor, side by side.

    python benchmarks/suite.py --presets transformer:small,convnet:small \
        --matmul-precision high --out docs/benchmarks

Per preset, in one process on one GPU:
1. the grid (`GRID_LEVELS`, every combination) is measured with a short protocol
   (`--grid-warmup` untimed steps, `--grid-windows` x `--grid-window-steps` timed);
2. a default tuning job (`tuner.search.run_study` with its defaults, profiling the baselines and
   the recommendation; `--search-timeout` caps its search) recommends a config; with
   `--repro` a second job with another seed recommends one too;
3. the seven settings (`pytorch-default`, `seed-baseline`, `seed-event10`, `seed-4streams`,
   `grid-best`, `recommended`, and the second job's `recommended-seed1` when there is one) are
   measured `--rounds` times, interleaved, each run with the tuner's protocol from the same
   initial weights; the `graph-floor` (whole step captured, replayed back to back: the GPU's
   own time for the step) is measured once per round too;
4. tuning cost: TPE, random search and the grid, 3 seeds each, replayed over the grid's
   measurements (`replay_search`): how many GPU-seconds each needs to reach a config within 3 %
   of the grid's best.

Writes `suite-<gpu>-<date>[-<tag>].json` (schema in `to_json`'s docstring) after each preset, and
a Markdown twin. `--readme docs/benchmarks/results.md` rewrites the headline table between that
file's `<!-- suite:begin -->` and `<!-- suite:end -->` markers from that JSON.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import optuna

from benchmarks.run_meta import run_meta
from trainers import LoopConfig, fingerprint, fingerprint_key, resolve_device
from tuner.search.isolated import ParityProcess
from tuner.search.measure import PRECISIONS, Failure, Measurer, Protocol, set_matmul_precision
from tuner.search.options import RunOptions
from tuner.search.search import run_study
from tuner.search.stats import bootstrap_ci, ratio_ci

PINNED = {"pin_memory": True, "non_blocking": True}
FIXED_SETTINGS: dict[str, LoopConfig] = {
    "pytorch-default": LoopConfig(),
    "seed-baseline": LoopConfig(num_streams=2, **PINNED),
    "seed-event10": LoopConfig(num_streams=2, sync_mode="event", sync_interval=10, **PINNED),
    "seed-4streams": LoopConfig(num_streams=4, sync_mode="event", sync_interval=10, **PINNED),
}
SETTING_ORDER = (
    "pytorch-default",
    "seed-baseline",
    "seed-event10",
    "seed-4streams",
    "grid-best",
    "recommended",
    "recommended-seed1",
    "graph-floor",
)

# The default space (tuner.space.full_space), discretised. Stream count and the sync settings
# get the values the seed design and GPU-FACTS use; the three feed settings move together, as
# the PyTorch idiom (no prefetch, pageable, batches made in the training process) or as a fed
# loop (prefetch 2, pinned, 2 DataLoader workers): 3 x 3 x 2 x 2 x 2 = 72 configs.
GRID_LEVELS: dict[str, tuple[Any, ...]] = {
    "num_streams": (1, 2, 4),
    "sync_mode": ("synchronize", "event", "query"),
    "sync_interval": (1, 20),
    "cuda_graph": (False, True),
}
FEEDS: tuple[dict[str, Any], ...] = (
    {"prefetch_depth": 0, "pin_memory": False, "num_workers": 0},
    {"prefetch_depth": 2, "pin_memory": True, "num_workers": 2},
)
GRID_NOTE = (
    "num_streams {1,2,4} x sync_mode {synchronize,event,query} x sync_interval {1,20} "
    "x cuda_graph {false,true} x feed {idiom: prefetch 0, pageable, 0 workers | fed: "
    "prefetch 2, pinned, 2 workers}; non_blocking true as in the default space"
)
TARGET_FRACTION = 0.03
SAMPLERS = ("tpe", "random", "grid")


# --------------------------------------------------------------------------------------------
# the grid
# --------------------------------------------------------------------------------------------


def grid_configs(*, cuda: bool) -> list[LoopConfig]:
    """Every config of the discretised default space (without CUDA graphs on a CPU)."""
    configs = []
    names = list(GRID_LEVELS)
    for values in itertools.product(*GRID_LEVELS.values()):
        setting = dict(zip(names, values, strict=True))
        if setting["cuda_graph"] and not cuda:
            continue
        for feed in FEEDS:
            configs.append(LoopConfig(non_blocking=True, **setting, **feed))
    return configs


def grid_params(config: LoopConfig) -> dict[str, Any]:
    """The replayed search's parameters of a grid config: the grid dimensions and the feed."""
    params = {name: getattr(config, name) for name in GRID_LEVELS}
    params["feed"] = next(
        i for i, feed in enumerate(FEEDS) if all(getattr(config, k) == v for k, v in feed.items())
    )
    return params


def measure_grid(
    measurer: Measurer, configs: Sequence[LoopConfig], log: Callable[[str], None]
) -> list[dict[str, Any]]:
    """One short run of each config: its window step times (ms) and the seconds it took."""
    entries = []
    for i, config in enumerate(configs):
        outcome = measurer.measure(config)
        entry: dict[str, Any] = {"config": config.to_dict(), "params": grid_params(config)}
        if isinstance(outcome, Failure):
            entry |= {"error": outcome.reason, "seconds": outcome.seconds}
        else:
            per_batch = measurer.workload.samples_per_batch
            windows = [per_batch * 1e3 / t for t in outcome.throughputs]
            entry |= {
                "windows_ms": windows,
                "step_ms": statistics.median(windows),
                "seconds": outcome.seconds,
            }
        entries.append(entry)
        log(
            f"grid {i + 1}/{len(configs)} {entry.get('step_ms', float('nan')):.3f} ms "
            f"{entry['params']}"
        )
    return entries


def grid_best(entries: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    measured = [e for e in entries if "step_ms" in e]
    if not measured:
        raise RuntimeError("no grid config could be measured")
    return min(measured, key=lambda e: e["step_ms"])


# --------------------------------------------------------------------------------------------
# tuning cost, replayed over the grid's measurements
# --------------------------------------------------------------------------------------------


def replay_search(
    entries: Sequence[Mapping[str, Any]],
    sampler: str,
    seed: int,
    *,
    target_fraction: float = TARGET_FRACTION,
    max_evaluations: int | None = None,
) -> dict[str, Any]:
    """Run `sampler` (tpe, random or grid) over the grid's dimensions, answering each trial with
    one measured window of that config, drawn at random (so the search sees the noise), and
    charging the seconds that config's grid run took. Stops when it has evaluated a config whose
    measured median is within `target_fraction` of the grid's best throughput (step time at
    most best / (1 - target_fraction)), or after `max_evaluations` (default: twice the grid).

    Returns evaluations, gpu_seconds, reached (bool) and the config it reached with. Configs
    that failed to run cost their seconds and answer as failed trials.
    """
    by_params = {json.dumps(e["params"], sort_keys=True): e for e in entries}
    best_ms = grid_best(entries)["step_ms"]
    limit = best_ms / (1.0 - target_fraction)
    space: dict[str, list[Any]] = {name: list(values) for name, values in GRID_LEVELS.items()}
    space["feed"] = list(range(len(FEEDS)))
    if not any(e["config"]["cuda_graph"] for e in entries):
        space["cuda_graph"] = [False]
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler: {sampler!r} is not one of {', '.join(SAMPLERS)}")
    rng = random.Random(seed)
    # The grid goes through every config once in a seeded random order (as optuna's
    # GridSampler would; it calls Study.stop when the grid runs out, which ask/tell cannot take).
    order = [e["params"] for e in random.Random(seed).sample(list(entries), len(entries))]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(
        sampler=(
            optuna.samplers.TPESampler(seed=seed)
            if sampler == "tpe"
            else optuna.samplers.RandomSampler(seed=seed)
        ),
        direction="minimize",
    )
    cap = (
        len(entries)
        if sampler == "grid"
        else (max_evaluations if max_evaluations is not None else 2 * len(entries))
    )
    seconds = 0.0
    for evaluation in range(1, cap + 1):
        trial = None if sampler == "grid" else study.ask()
        params = (
            dict(order[evaluation - 1])
            if trial is None
            else {name: trial.suggest_categorical(name, values) for name, values in space.items()}
        )
        key = json.dumps(params, sort_keys=True)
        if key not in by_params:
            raise ValueError(f"the grid has no entry for {params}")
        entry = by_params[key]
        seconds += entry["seconds"]
        if "step_ms" not in entry:
            if trial is not None:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
            continue
        if trial is not None:
            study.tell(trial, rng.choice(entry["windows_ms"]))
        if entry["step_ms"] <= limit:
            return {
                "evaluations": evaluation,
                "gpu_seconds": seconds,
                "reached": True,
                "config": entry["config"],
            }
    return {"evaluations": cap, "gpu_seconds": seconds, "reached": False, "config": None}


def tuning_cost(
    entries: Sequence[Mapping[str, Any]],
    seeds: Sequence[int] = (0, 1, 2),
    job: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Replayed cost of each sampler over `seeds`, against the grid's own GPU-seconds."""
    grid_seconds = sum(e["seconds"] for e in entries)
    out: dict[str, Any] = {
        "method": (
            "replayed over the grid's measurements: each trial is answered with one of "
            "that config's measured windows at random and costs the seconds its grid "
            "run took"
        ),
        "target": f"a config within {TARGET_FRACTION:.0%} of the grid's best throughput",
        "grid_gpu_seconds": grid_seconds,
        "samplers": {},
    }
    for sampler in SAMPLERS:
        runs = [replay_search(entries, sampler, seed) | {"seed": seed} for seed in seeds]
        costs = [r["gpu_seconds"] for r in runs]
        out["samplers"][sampler] = {
            "runs": runs,
            "gpu_seconds_median": statistics.median(costs),
            "fraction_of_grid_median": statistics.median(costs) / grid_seconds,
            "all_reached": all(r["reached"] for r in runs),
        }
    if job is not None:
        out["default_job"] = job
    return out


def job_cost(study: optuna.Study, best_ms: float) -> dict[str, Any]:
    """The real default job: GPU-seconds of its trials (in trial order) until the first complete
    trial within the target of the grid's best, and in all."""
    limit = best_ms / (1.0 - TARGET_FRACTION)
    spent = 0.0
    reached_at: dict[str, Any] | None = None
    for trial in sorted(study.trials, key=lambda t: t.number):
        spent += float(trial.user_attrs.get("seconds", 0.0))
        step_ms = trial.user_attrs.get("step_ms")
        if (
            reached_at is None
            and trial.state == optuna.trial.TrialState.COMPLETE
            and step_ms is not None
            and step_ms <= limit
        ):
            reached_at = {"trial": trial.number, "gpu_seconds": spent}
    return {
        "method": "the real default job's trials, with the tuner's protocol",
        "reached": reached_at is not None,
        "reached_at": reached_at,
        "trials_gpu_seconds": spent,
    }


# --------------------------------------------------------------------------------------------
# the side-by-side comparison
# --------------------------------------------------------------------------------------------


def compare(
    measurer: Measurer,
    settings: Mapping[str, LoopConfig],
    *,
    rounds: int,
    log: Callable[[str], None],
) -> dict[str, dict[str, Any]]:
    """Every setting `rounds` times, interleaved, plus the graph floor once per round."""
    windows: dict[str, list[float]] = {name: [] for name in settings}
    peaks: dict[str, int | None] = {}
    errors: dict[str, str] = {}
    floors: list[float] = []
    per_batch = measurer.workload.samples_per_batch
    for r in range(rounds):
        for name, config in settings.items():
            outcome = measurer.measure(config)
            if isinstance(outcome, Failure):
                errors[name] = outcome.reason
                log(f"round {r + 1} {name}: {outcome.reason}")
                continue
            windows[name] += [per_batch * 1e3 / t for t in outcome.throughputs]
            peaks[name] = outcome.peak_memory_bytes
            log(f"round {r + 1} {name} {outcome.step_ms:.3f} ms")
        floor = measurer.floor_ms()
        if floor is not None:
            floors.append(floor)
    out: dict[str, dict[str, Any]] = {}
    seed_windows = windows.get("seed-baseline") or []
    floor_ms = statistics.median(floors) if floors else None
    for name, config in settings.items():
        entry: dict[str, Any] = {"config": config.to_dict()}
        if not windows[name]:
            out[name] = entry | {"error": errors.get(name, "not measured")}
            continue
        median = statistics.median(windows[name])
        entry |= {
            "step_ms_median": median,
            "ci95": list(bootstrap_ci(windows[name])),
            "windows_ms": windows[name],
            "floor_ratio": None if floor_ms is None else floor_ms / median,
            "peak_memory_bytes": peaks.get(name),
        }
        if seed_windows:
            ratio, low, high = ratio_ci(seed_windows, windows[name])
            entry |= {"speedup_vs_seed_baseline": ratio, "speedup_ci95": [low, high]}
        out[name] = entry
    if floors:
        out["graph-floor"] = {
            "config": None,
            "step_ms_median": floor_ms,
            "ci95": list(bootstrap_ci(floors)),
            "repeats_ms": floors,
            "floor_ratio": 1.0,
            "peak_memory_bytes": None,
            "speedup_vs_seed_baseline": (
                statistics.median(seed_windows) / floor_ms if seed_windows and floor_ms else None
            ),
        }
    return out


# --------------------------------------------------------------------------------------------
# one preset
# --------------------------------------------------------------------------------------------


def default_job(
    workload: str,
    preset: str,
    *,
    storage: str,
    seed: int,
    device: str,
    precision: str,
    timeout_s: float | None,
) -> tuple[dict[str, Any], optuna.Study]:
    name = f"suite-{workload}-{preset}-seed{seed}"
    started = time.perf_counter()
    rec = run_study(
        RunOptions(
            workload=workload,
            preset=preset,
            storage=storage,
            study=name,
            seed=seed,
            device=device,
            matmul_precision=precision,
            timeout_s=timeout_s,
            profile="baselines",
        )
    ).to_dict()
    study = optuna.load_study(study_name=name, storage=storage)
    summary = {
        "study": name,
        "seed": seed,
        "config": rec.get("config"),
        "source": rec.get("source"),
        "reason": rec.get("reason"),
        "n_trials": rec.get("n_trials"),
        "gpu_seconds": rec.get("gpu_seconds"),
        "wall_s": time.perf_counter() - started,
        "search_timeout_s": timeout_s,
        "verdicts": rec.get("verdicts"),
        "explanation": rec.get("explanation"),
    }
    return summary, study


def run_preset(
    spec: str, args: argparse.Namespace, storage: str, log: Callable[[str], None]
) -> dict[str, Any]:
    workload, preset = spec.split(":", 1)
    started = time.perf_counter()
    grid_protocol = Protocol(
        warmup=args.grid_warmup, windows=args.grid_windows, window_steps=args.grid_window_steps
    )
    measurer = Measurer(workload, preset, device=args.device, protocol=grid_protocol)
    cuda = measurer.device.type == "cuda"
    configs = grid_configs(cuda=cuda)
    entries = measure_grid(measurer, configs, log)
    best = grid_best(entries)
    parity: dict[str, Any] | None = None
    if cuda:
        checker = ParityProcess(
            workload,
            preset,
            steps=20,
            seed=0,
            device=str(measurer.device),
            matmul_precision=args.matmul_precision,
        )
        try:
            parity = checker.check(LoopConfig.from_dict(best["config"])).to_dict()
        finally:
            checker.close()
    jobs = []
    studies = []
    for seed in (0, 1) if spec in args.repro else (0,):
        log(f"default tuning job, seed {seed}")
        summary, study = default_job(
            workload,
            preset,
            storage=storage,
            seed=seed,
            device=args.device,
            precision=args.matmul_precision,
            timeout_s=args.search_timeout.get(spec),
        )
        jobs.append(summary)
        studies.append(study)
    settings = dict(FIXED_SETTINGS)
    settings["grid-best"] = LoopConfig.from_dict(best["config"])
    for job, name in zip(jobs, ("recommended", "recommended-seed1"), strict=False):
        if job["config"] is not None:
            settings[name] = LoopConfig.from_dict(job["config"])
    measurer.protocol = Protocol()  # the tuner's own protocol from here on
    compared = compare(measurer, settings, rounds=args.rounds, log=log)
    reproducibility = None
    if "recommended-seed1" in compared and "step_ms_median" in compared["recommended-seed1"]:
        # Throughput of seed 0's recommendation over seed 1's = seed 1's step time over seed 0's.
        ratio, low, high = ratio_ci(
            compared["recommended-seed1"]["windows_ms"], compared["recommended"]["windows_ms"]
        )
        reproducibility = {
            "jobs": [{"seed": j["seed"], "config": j["config"]} for j in jobs],
            "throughput_ratio": ratio,
            "ci95": [low, high],
            "note": "throughput of seed 0's recommendation over seed 1's",
            "within_3pct": abs(ratio - 1.0) <= TARGET_FRACTION,
        }
    return {
        "workload": workload,
        "preset": preset,
        "settings": compared,
        "grid": {
            "discretisation": GRID_NOTE,
            "size": len(entries),
            "protocol": grid_protocol.to_dict(),
            "best": best,
            "best_parity": parity,
            "gpu_seconds": sum(e["seconds"] for e in entries),
            "entries": entries,
        },
        "jobs": jobs,
        "tuning_cost": tuning_cost(entries, job=job_cost(studies[0], best["step_ms"])),
        "reproducibility": reproducibility,
        "rounds": args.rounds,
        "wall_s": time.perf_counter() - started,
    }


# --------------------------------------------------------------------------------------------
# output
# --------------------------------------------------------------------------------------------


def to_json(meta: Mapping[str, Any], presets: Mapping[str, Any]) -> dict[str, Any]:
    """{"meta": {gpu, driver, cuda, torch, commit, date, matmul_precision, command},
    "presets": {"transformer:small": {"settings": {name: {step_ms_median, ci95, floor_ratio,
    speedup_vs_seed_baseline, peak_memory_bytes, config}}, "tuning_cost": {...},
    "reproducibility": {...} | null, "grid": {...}, "jobs": [...]}}, "targets": {...}}."""
    return {"meta": dict(meta), "presets": dict(presets), "targets": targets(presets)}


def targets(presets: Mapping[str, Any]) -> dict[str, Any]:
    """Where the suite stands against each aim of the benchmark issue, met or not."""
    wanted_speedup = {"transformer:small": 6.0, "transformer:medium": 2.5, "transformer:large": 1.2}
    out: dict[str, Any] = {}
    for spec, data in presets.items():
        rec = data["settings"].get("recommended", {})
        ratio = rec.get("floor_ratio")
        entry: dict[str, Any] = {
            "floor_ratio": ratio,
            "floor_ratio_met": ratio is not None and ratio >= 0.95,
        }
        if spec in wanted_speedup:
            speedup = rec.get("speedup_vs_seed_baseline")
            entry |= {
                "speedup_wanted": wanted_speedup[spec],
                "speedup": speedup,
                "speedup_met": speedup is not None and speedup >= wanted_speedup[spec],
            }
        tpe = data["tuning_cost"]["samplers"]["tpe"]
        entry |= {
            "tpe_fraction_of_grid": tpe["fraction_of_grid_median"],
            "tpe_cost_met": tpe["all_reached"] and tpe["fraction_of_grid_median"] <= 0.25,
        }
        repro = data.get("reproducibility")
        if repro is not None:
            entry["reproducibility_met"] = repro["within_3pct"]
        out[spec] = entry
    return out


def _ms(entry: Mapping[str, Any]) -> str:
    if "step_ms_median" not in entry:
        return f"failed: {entry.get('error', '?')[:60]}"
    low, high = entry["ci95"]
    return f"{entry['step_ms_median']:.2f} ({low:.2f}-{high:.2f})"


def _short(config: Mapping[str, Any] | None) -> str:
    if not config:
        return ""
    graph = ", graph" if config["cuda_graph"] else ""
    memory = "pinned" if config["pin_memory"] else "pageable"
    feed = f", prefetch {config['prefetch_depth']}, {memory}, {config['num_workers']} workers"
    return (
        f"{config['num_streams']} str, {config['sync_mode']}/{config['sync_interval']}{graph}{feed}"
    )


def headline(data: Mapping[str, Any]) -> str:
    """The README's table: per preset, step time of each setting and the recommended config's
    speedup, floor ratio and where it stands."""
    lines = [
        "| preset | PyTorch idiom ms | seed-baseline ms | seed 4 streams ms | grid-best ms "
        "| recommended ms | graph floor ms | recommended vs seed-baseline "
        "| floor/recommended |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for spec, preset in data["presets"].items():
        s = preset["settings"]
        rec = s.get("recommended", {})

        def cell(name: str, s: Mapping[str, Any] = s) -> str:
            entry = s.get(name)
            return (
                "-"
                if entry is None or "step_ms_median" not in entry
                else f"{entry['step_ms_median']:.2f}"
            )

        speed = rec.get("speedup_vs_seed_baseline")
        ci = rec.get("speedup_ci95") or [float("nan")] * 2
        ratio = rec.get("floor_ratio")
        lines.append(
            f"| {spec} | {cell('pytorch-default')} | {cell('seed-baseline')} "
            f"| {cell('seed-4streams')} | {cell('grid-best')} | {cell('recommended')} "
            f"| {cell('graph-floor')} | "
            + ("-" if speed is None else f"{speed:.2f}x ({ci[0]:.2f}-{ci[1]:.2f})")
            + " | "
            + ("-" if ratio is None else f"{ratio:.2f}")
            + " |"
        )
    meta = data["meta"]
    lines += [
        "",
        f"Measured by `benchmarks/suite.py` on {meta['gpu']} (driver {meta['driver']}, "
        f"CUDA {meta['cuda']}, torch {meta['torch']}), commit `{meta['commit']}`, "
        f"{meta['date']}, float32 matmul precision `{meta['matmul_precision']}`; median "
        "ms/step of interleaved runs, speedup with its 95 % bootstrap CI. Generated from "
        f"`{meta['file']}`.",
    ]
    return "\n".join(lines)


def to_markdown(data: Mapping[str, Any]) -> str:
    meta = data["meta"]
    out = [
        f"# Benchmark suite on {meta['gpu']}",
        "",
        f"Driver {meta['driver']}, CUDA {meta['cuda']}, torch {meta['torch']}; commit "
        f"`{meta['commit']}`; {meta['date']}; float32 matmul precision "
        f"`{meta['matmul_precision']}`; `{meta['command']}`.",
        "",
        "## Headline",
        "",
        headline(data),
        "",
    ]
    for spec, preset in data["presets"].items():
        run = preset.get("run")
        out += (
            [f"## {spec}", ""]
            + ([f"Run: commit `{run['commit']}`, `{run['command']}`.", ""] if run else [])
            + [
                "| setting | ms/step (95 % CI) | floor/step | vs seed-baseline (95 % CI) "
                "| peak memory MiB | config |",
                "|---|---|---|---|---|---|",
            ]
        )
        for name in SETTING_ORDER:
            entry = preset["settings"].get(name)
            if entry is None:
                continue
            speed = entry.get("speedup_vs_seed_baseline")
            ci = entry.get("speedup_ci95")
            peak = entry.get("peak_memory_bytes")
            out.append(
                f"| {name} | {_ms(entry)} | "
                + ("-" if entry.get("floor_ratio") is None else f"{entry['floor_ratio']:.2f}")
                + " | "
                + (
                    "-"
                    if speed is None
                    else f"{speed:.2f}x" + (f" ({ci[0]:.2f}-{ci[1]:.2f})" if ci else "")
                )
                + " | "
                + ("-" if peak is None else f"{peak / 2**20:.0f}")
                + f" | {_short(entry.get('config'))} |"
            )
        grid = preset["grid"]
        cost = preset["tuning_cost"]
        out += [
            "",
            f"Grid: {grid['size']} configs ({grid['discretisation']}), "
            f"{grid['gpu_seconds']:.0f} GPU-s with warm-up {grid['protocol']['warmup']} + "
            f"{grid['protocol']['windows']} x {grid['protocol']['window_steps']} steps each; "
            f"best {grid['best']['step_ms']:.2f} ms ({_short(grid['best']['config'])}); "
            f"its parity: {(grid['best_parity'] or {}).get('passed', 'not checked')}.",
            "",
            f"Tuning cost to reach {cost['target']} ({cost['method']}):",
            "",
            "| sampler | GPU-s per seed | median fraction of the grid's GPU-s | all reached |",
            "|---|---|---|---|",
        ]
        for sampler, entry in cost["samplers"].items():
            per_seed = ", ".join(
                f"{r['gpu_seconds']:.1f}" + ("" if r["reached"] else " (not)")
                for r in entry["runs"]
            )
            out.append(
                f"| {sampler} | {per_seed} | {entry['fraction_of_grid_median']:.2f} "
                f"| {entry['all_reached']} |"
            )
        job = cost.get("default_job")
        if job is not None:
            reached = job["reached_at"]
            out += [
                "",
                "Real default job: "
                + (
                    f"trial {reached['trial']} reached the target after "
                    f"{reached['gpu_seconds']:.1f} GPU-s of trials"
                    if reached
                    else "no trial reached the target"
                )
                + f" ({job['trials_gpu_seconds']:.0f} GPU-s of trials in all).",
            ]
        for j in preset["jobs"]:
            n = j.get("n_trials") or {}
            out.append(
                f"- job seed {j['seed']}: {_short(j['config'])}; trials "
                f"{n.get('complete', 0)}/{n.get('failed', 0)}/{n.get('pruned', 0)} "
                f"(complete/failed/pruned), {j['wall_s']:.0f} s wall"
                + (
                    f", search capped at {j['search_timeout_s']:.0f} s"
                    if j.get("search_timeout_s")
                    else ""
                )
                + (f"; {j['explanation']}" if j.get("explanation") else "")
            )
        repro = preset.get("reproducibility")
        if repro is not None:
            out.append(
                f"- reproducibility: seed 0's recommendation runs at "
                f"{repro['throughput_ratio']:.3f}x seed 1's throughput "
                f"(95 % CI {repro['ci95'][0]:.3f}-{repro['ci95'][1]:.3f}; within 3 %: "
                f"{repro['within_3pct']})"
            )
        out.append("")
    out += [
        "## Against the aims",
        "",
        "| preset | floor/recommended >= 0.95 | speedup aim "
        "| TPE fraction of grid GPU-s <= 0.25 | two jobs within 3 % |",
        "|---|---|---|---|---|",
    ]
    for spec, t in data["targets"].items():
        speed = (
            "-"
            if "speedup_wanted" not in t
            else f"{(t['speedup'] or 0):.2f}x vs {t['speedup_wanted']}x: "
            f"{'met' if t['speedup_met'] else 'not met'}"
        )
        ratio = "-" if t["floor_ratio"] is None else f"{t['floor_ratio']:.2f}"
        out.append(
            f"| {spec} | {ratio}: {'met' if t['floor_ratio_met'] else 'not met'} "
            f"| {speed} | {t['tpe_fraction_of_grid']:.2f}: "
            f"{'met' if t['tpe_cost_met'] else 'not met'} | "
            + (
                "-"
                if "reproducibility_met" not in t
                else ("met" if t["reproducibility_met"] else "not met")
            )
            + " |"
        )
    return "\n".join(out) + "\n"


def merge(runs: Sequence[Mapping[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """One suite file from several runs on the same GPU and software (one run per 10-minute
    command): each preset keeps its run's commit, command and file under `run`."""
    first = runs[0]["meta"]
    keys = ("gpu", "driver", "cuda", "torch", "matmul_precision")
    presets: dict[str, Any] = {}
    for data, name in zip(runs, names, strict=True):
        meta = data["meta"]
        if any(meta[k] != first[k] for k in keys):
            raise ValueError(
                f"{name}: measured on {[meta[k] for k in keys]}, not on "
                f"{[first[k] for k in keys]}: runs on other hardware or software "
                "cannot be merged"
            )
        for spec, preset in data["presets"].items():
            presets[spec] = dict(preset) | {
                "run": {"commit": meta["commit"], "file": name, "command": meta["command"]}
            }
    commits = sorted({p["run"]["commit"] for p in presets.values()})
    meta = {k: first[k] for k in (*keys, "fingerprint", "date") if k in first} | {
        "commit": ", ".join(commits),
        "file": f"suite-{gpu_key(first.get('fingerprint') or first)}-{first['date']}.json",
        "command": "python benchmarks/suite.py --merge " + " ".join(names),
    }
    return to_json(meta, presets)


BEGIN, END = "<!-- suite:begin -->", "<!-- suite:end -->"


def update_readme(readme: Path, data: Mapping[str, Any]) -> None:
    text = readme.read_text(encoding="utf-8")
    if BEGIN not in text or END not in text:
        raise ValueError(f"{readme}: no {BEGIN} ... {END} block to rewrite")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    readme.write_text(f"{head}{BEGIN}\n{headline(data)}\n{END}{tail}", encoding="utf-8")


def gpu_key(fp: Mapping[str, Any]) -> str:
    """'h100' for an NVIDIA H100 80GB HBM3, else the fingerprint's key, lower case."""
    found = re.search(r"\b([A-Z]\d{2,4})\b", fp.get("gpu") or "")
    return found.group(1).lower() if found else fingerprint_key(dict(fp)).lower()


def _parse_caps(text: str) -> dict[str, float]:
    caps = {}
    for item in filter(None, text.split(",")):
        spec, _, seconds = item.rpartition("=")
        caps[spec] = float(seconds)
    return caps


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--presets", default="transformer:small,transformer:medium,transformer:large,convnet:small"
    )
    parser.add_argument("--device", default="auto")
    parser.add_argument("--matmul-precision", choices=PRECISIONS, default="highest")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--grid-warmup", type=int, default=10)
    parser.add_argument("--grid-windows", type=int, default=2)
    parser.add_argument("--grid-window-steps", type=int, default=10)
    parser.add_argument(
        "--search-timeout",
        type=_parse_caps,
        default={},
        help="workload:preset=SECONDS,... caps a default job's search",
    )
    parser.add_argument(
        "--repro",
        default="transformer:small",
        help="presets (comma-separated) that get a second, independent job",
    )
    parser.add_argument("--storage-dir", type=Path, default=None)
    parser.add_argument("--tag", default="")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"))
    parser.add_argument(
        "--from-json",
        type=Path,
        default=None,
        help="skip measuring: regenerate Markdown/README from this JSON",
    )
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        help="skip measuring: merge the presets of these suite JSON files (one "
        "10-minute run each) into --out/suite-<gpu>-<date>.json",
    )
    parser.add_argument("--readme", type=Path, default=None)
    parser.add_argument("--commit", default=os.environ.get("STREAMTUNE_COMMIT", "unknown"))
    args = parser.parse_args(argv)
    args.repro = {s for s in args.repro.split(",") if s}

    if args.merge is not None:
        data = merge(
            [json.loads(p.read_text(encoding="utf-8")) for p in args.merge],
            [p.name for p in args.merge],
        )
        path = args.out / data["meta"]["file"]
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        path.with_suffix(".md").write_text(to_markdown(data), encoding="utf-8")
        if args.readme is not None:
            update_readme(args.readme, data)
        return
    if args.from_json is not None:
        data = json.loads(args.from_json.read_text(encoding="utf-8"))
        args.from_json.with_suffix(".md").write_text(to_markdown(data), encoding="utf-8")
        if args.readme is not None:
            update_readme(args.readme, data)
        return

    set_matmul_precision(args.matmul_precision)
    storage_dir = args.storage_dir or Path(tempfile.mkdtemp(prefix="streamtune-suite-"))
    storage_dir.mkdir(parents=True, exist_ok=True)
    storage = f"sqlite:///{storage_dir / 'suite.db'}"
    device = resolve_device(args.device)
    meta, _ = run_meta(device, "suite.py", sys.argv[1:] if argv is None else argv, args.commit)
    fp = fingerprint(device)
    stem = f"suite-{gpu_key(fp)}-{meta['date']}" + (f"-{args.tag}" if args.tag else "")
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{stem}.json"
    meta |= {"fingerprint": fp, "matmul_precision": args.matmul_precision, "file": path.name}

    def log(text: str) -> None:
        print(text, flush=True)

    presets: dict[str, Any] = {}
    for spec in filter(None, args.presets.split(",")):
        presets[spec] = run_preset(spec, args, storage, log)
        data = to_json(meta, presets)
        path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        path.with_suffix(".md").write_text(to_markdown(data), encoding="utf-8")
        log(f"wrote {path} ({spec} done in {presets[spec]['wall_s']:.0f} s)")
    if args.readme is not None:
        update_readme(args.readme, to_json(meta, presets))


if __name__ == "__main__":
    main()
