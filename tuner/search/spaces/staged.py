"""Settings the scale space searches through its second stage alone, never by the sampler's draws.

A whole-step CUDA graph over the compiled step (`cuda_graph`) is such a setting. On one H200
(2026-12-04, `docs/benchmarks/peers-h200-2026-12-04-graph-float8-*.md`), the scale space's
float8 step with the whole model compiled ran 1.04x (1.03-1.04) the same step without the graph
at the Qwen1.5-0.5B shape (0.46B, 115 against 119 ms) and 1.01x (1.00-1.02) at `llama-1b` (1.1B):
worth one trial where the step is short, a tie where it is long. Its trial right after the
leader runs the leader's kept code (`trainers.keeps_code`), but a config with a graph that
wins is gated through the eager twin, a compile under strict determinism (123 s of a 195 s gate
at the Qwen2-style shape on an H200, 2026-12-04), and any other draw compiles too, so it is
tried once, from the leader (`tuner.search.proposing.levers`), not whenever the sampler happens
to draw it: each draw the predictions cannot price would cost a compile.

The sampler keeps each such setting at its value here (Optuna's `PartialFixedSampler`); a trial
the second stage enqueues sets its own value, which Optuna takes before asking the sampler.
"""

from __future__ import annotations

import warnings
from typing import Any

import optuna

from tuner.search.spaces.space import Choice, SearchSpace

STAGED_ONLY: dict[str, Any] = {"cuda_graph": False}
"""Each setting the second stage alone tries, with the value every draw of the sampler takes."""
STAGED_SPACES = ("scale",)
"""The spaces whose STAGED_ONLY settings only a stage tries (`named.SCALE_SPACE`: its trials
each cost a compile). Elsewhere (`auto`, `compile`, a space file) the sampler draws them as any
other setting, as a user who lists them would expect."""


def staged_fields(space: SearchSpace) -> dict[str, tuple[Any, ...]]:
    """The STAGED_ONLY settings `space` searches, each with the values it searches."""
    if space.name not in STAGED_SPACES:
        return {}
    return {
        field: spec.values
        for field, spec in space.params.items()
        if field in STAGED_ONLY and isinstance(spec, Choice)
    }


def draws_hold(space: SearchSpace) -> dict[str, Any]:
    """The STAGED_ONLY settings `space` searches, each with the value every draw of its sampler
    takes (`sampler_for`)."""
    return {field: STAGED_ONLY[field] for field in staged_fields(space)}


def pin_off(
    space: SearchSpace, params: dict[str, Any], fixed: dict[str, Any], notes: list[str], note: str
) -> None:
    """Take `cuda_graph` out of `params` into `fixed` as false, where a run cannot capture one
    (a CPU, several processes), with `note` saying why, unless `space` searched it by its stage
    alone: no draw took it there, so the space is the one stored before it was staged, and a
    study of it resumes as the same question (`tuner.search.spaces.resume`)."""
    if "cuda_graph" not in params:
        return
    staged = "cuda_graph" in staged_fields(space)
    del params["cuda_graph"]
    fixed["cuda_graph"] = False
    if not staged:
        notes.append(note)


def sampler_for(
    space: SearchSpace | None, sampler: optuna.samplers.BaseSampler
) -> optuna.samplers.BaseSampler:
    """`sampler`, keeping `space`'s staged settings at their STAGED_ONLY values (itself where
    there are none)."""
    pins = {} if space is None else draws_hold(space)
    if not pins:
        return sampler
    with warnings.catch_warnings():
        # Experimental since Optuna 2.4 and unchanged since; the warning would print once per
        # trial, where the sampler is made again with the trial's seed.
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        return optuna.samplers.PartialFixedSampler(fixed_params=pins, base_sampler=sampler)
