"""What the search profiles: a trial (`--profile all`) and, after deciding, the baselines and
the recommended config; in this process on a CPU, in a child process on a GPU."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping
from pathlib import Path

import optuna
import torch

import trainers
from trainers import LoopConfig, Workload
from tuner.evidence.profiles import store_profile
from tuner.evidence.recommendation import Recommendation
from tuner.evidence.trace import Profile, profile_config
from tuner.evidence.verdicts import Verdict, explain, verdict
from tuner.store.keys import PROFILE_ERROR, PROFILE_PREFIX, PROFILE_RECOMMENDED

Profiler = Callable[..., Profile]
"""`profiler(config)` profiles in the study's precision; `profiler(config, precision=p)` in p."""


def in_process(
    workload: Workload,
    *,
    device: str | torch.device,
    steps: int = 10,
    warmup: int = 5,
    precision: trainers.Precision | None = None,
) -> Profiler:
    """A profiler that profiles in this process (on a CPU; on a GPU the tuner profiles in a
    child process, `tuner.search.isolated.ProfileProcess`, since CUPTI outlasts the profile)."""
    return functools.partial(
        profile_config, workload, steps=steps, warmup=warmup, device=device, precision=precision
    )


def profile_trial(
    trial: optuna.Trial,
    config: LoopConfig,
    directory: Path | None,
    profiler: Profiler,
    *,
    precision: str | None = None,
) -> None:
    """`--profile all`: profile a trial's config (in its `precision`; None: the study's) and
    store it on the (running) trial. A failure is recorded as the attribute `profile_error`,
    never raised: the trial's measurement stands."""
    try:
        profile = profiler(config) if precision is None else profiler(config, precision=precision)
        store_profile(trial, profile, directory)
    except Exception as exc:  # noqa: BLE001 - a profile is evidence, not the trial's result
        trial.set_user_attr(PROFILE_ERROR, f"{type(exc).__name__}: {exc}"[:2000])


def profile_recommendation(
    study: optuna.Study,
    recommendation: Recommendation,
    baselines: Mapping[str, LoopConfig],
    directory: Path | None,
    profiler: Profiler,
) -> Recommendation:
    """Profile the baselines and the recommended config, store them on the study, and return
    the recommendation with the profiles' `verdicts` (name -> verdict) and `explanation`."""
    targets: dict[str, LoopConfig] = dict(baselines)
    if recommendation.config is not None:
        targets[PROFILE_RECOMMENDED] = LoopConfig.from_dict(recommendation.config)
    verdicts: dict[str, Verdict] = {}
    errors: dict[str, str] = {}
    for name, config in targets.items():
        # The recommended config in the precision it was chosen in (a study searching them).
        chosen = recommendation.precision if name == PROFILE_RECOMMENDED else None
        try:
            prof = profiler(config) if chosen is None else profiler(config, precision=chosen)
        except Exception as exc:  # noqa: BLE001 - recorded; the recommendation stands
            errors[name] = f"{type(exc).__name__}: {exc}"[:2000]
            with contextlib.suppress(Exception):
                study.set_user_attr(f"{PROFILE_PREFIX}{name}", {"error": errors[name]})
            continue
        store_profile(study, prof, directory, name=name)
        verdicts[name] = verdict(prof)
    return recommendation.with_evidence(
        verdicts={name: v.to_dict() for name, v in verdicts.items()},
        explanation=explain(recommendation.to_dict(), verdicts),
        profile_errors=errors,
    )
