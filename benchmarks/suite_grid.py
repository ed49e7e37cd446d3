"""The grid of `benchmarks/suite.py`: the default space discretised (`grid_configs`), each config
measured once with a short protocol (`measure_grid`), and the tuning cost replayed over those
measurements (`replay_search`, `tuning_cost`) beside the real default job's (`job_cost`).
"""

from __future__ import annotations

import itertools
import json
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna

from benchmarks.interleaved import windows_ms
from trainers import LoopConfig
from tuner.search.measuring.measure import Failure, Measurer

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
            windows = windows_ms(measurer, outcome)
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
    space = _replay_space(entries)
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler: {sampler!r} is not one of {', '.join(SAMPLERS)}")
    rng = random.Random(seed)
    # The grid goes through every config once in a seeded random order (as optuna's
    # GridSampler would; it calls Study.stop when the grid runs out, which ask/tell cannot take).
    order = [e["params"] for e in random.Random(seed).sample(list(entries), len(entries))]
    study = _replay_study(sampler, seed)
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


def _replay_space(entries: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]]:
    """The replayed search's dimensions: the grid's and the feed (no graphs where the grid ran
    without them)."""
    space: dict[str, list[Any]] = {name: list(values) for name, values in GRID_LEVELS.items()}
    space["feed"] = list(range(len(FEEDS)))
    if not any(e["config"]["cuda_graph"] for e in entries):
        space["cuda_graph"] = [False]
    return space


def _replay_study(sampler: str, seed: int) -> optuna.Study:
    """An in-memory study for the replay: TPE's or random search's sampler, seeded (the grid
    asks nothing of it)."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna.create_study(
        sampler=(
            optuna.samplers.TPESampler(seed=seed)
            if sampler == "tpe"
            else optuna.samplers.RandomSampler(seed=seed)
        ),
        direction="minimize",
    )


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
