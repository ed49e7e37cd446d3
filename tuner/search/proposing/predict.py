"""Predict a candidate's peak memory and speed before running it, from what the study measured.

Automatic planners for distributed training predict each config's time and memory from symbolic
expressions before running any (Mist, EuroSys 2025; Colossal-Auto's symbolic profiler). Here the
expressions are of the memory levers alone, and their inputs are the study's own measurements:

- **Memory.** A step's peak is the model state (weights, gradients and AdamW's two moments in
  fp32: STATE_BYTES_PER_PARAM per parameter) plus activations. A measured trial gives its
  activations (peak less state); divided by the trial's `activation_factor` they are the
  activations of one plain step in that precision, and a candidate's peak is the state plus
  those times its own factor. A trial that ran out of memory gives a lower bound instead: every
  candidate keeping at least as many activations (same precision) does not fit either.
- **Time.** A candidate differs from a measured trial of its family (the same precision and the
  same settings apart from the memory levers) by recomputation and micro-batches, whose costs
  are factors on the step (`time_factor`): its predicted throughput is that trial's, scaled.

The factors are the ratios measured on a Llama-style 1.1B decoder on an H100 (16 x 2048 tokens,
bf16, fused AdamW; torch 2.11): selective checkpointing kept 0.49 of the activations for a 1.10x
slower step (41.4 against 65.8 GB peak, 478.6 against 434.7 ms), checkpointing every block kept
0.13 for 1.25x (23.6 GB, 624.5 against 500.1 ms), four micro-batches kept 0.29 of them for 1.07x
(31.0 GB, 534.5 ms), two micro-batches ran 1.07x slower at 8 x 2048 (33.8 against 36.1
samples/s). A candidate is never run when it is predicted not to fit with MEMORY_SPARE to spare,
or to lose to the incumbent by more than the tie margin plus TIME_SPARE: each prediction is kept
on the trial, and checked against the measurement where the trial ran (`check`), so the record
says how often the predictions were right.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

import optuna
from optuna.trial import TrialState

import trainers
from trainers import LoopConfig
from tuner.search.proposing.screen import Incumbent
from tuner.store import keys

STATE_BYTES_PER_PARAM = 16
"""fp32 weights (4), their gradients (4) and AdamW's two moments (8): what a step keeps besides
its activations, whatever the levers."""
SELECTIVE_KEEPS = 0.5
BLOCKS_FREE = 0.87
"""Checkpointing a block frees this share of its activations (it keeps its input)."""
SELECTIVE_COST = 1.10
BLOCKS_COST = 0.25
"""Checkpointing every block makes a step 1 + BLOCKS_COST slower (its forward runs twice)."""
MICRO_BATCH_COST = 1.05
"""Splitting a batch runs the same FLOPs in smaller matrix products: never faster."""
MEMORY_SPARE = 0.05
"""A candidate is skipped for memory only when predicted over the device's memory by this share."""
TIME_SPARE = 0.02
"""... and for speed only when predicted to lose by the tie margin plus this share."""
MEMORY_LEVERS = ("activation_checkpointing", "checkpoint_share", "micro_batches")


def activation_factor(config: LoopConfig) -> float:
    """The share of a plain step's activations `config` keeps at its peak."""
    kept = 1.0 / config.micro_batches
    if config.activation_checkpointing == "selective":
        kept *= SELECTIVE_KEEPS
    elif config.activation_checkpointing == "blocks":
        kept *= 1.0 - BLOCKS_FREE * config.checkpoint_share
    return kept


def time_factor(config: LoopConfig) -> float:
    """How much longer `config`'s step takes than its family's plain one (>= 1)."""
    factor = MICRO_BATCH_COST if config.micro_batches > 1 else 1.0
    if config.activation_checkpointing == "selective":
        factor *= SELECTIVE_COST
    elif config.activation_checkpointing == "blocks":
        factor *= 1.0 + BLOCKS_COST * config.checkpoint_share
    return factor


def family(config: LoopConfig, precision: str | None) -> tuple[Any, ...]:
    """What a config shares with those its speed is predicted from: all but the memory levers."""
    values = trainers.canonical(config.to_dict())
    return (precision, *sorted((k, v) for k, v in values.items() if k not in MEMORY_LEVERS))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Prediction:
    """A candidate's predicted peak and throughput, what they came from, and the decision."""

    peak_bytes: float | None = None
    fits: bool | None = None
    memory_basis: int | None = None
    """The trial the memory prediction came from (measured or out of memory)."""
    throughput: float | None = None
    time_basis: int | None = None
    incumbent: float | None = None
    incumbent_trial: int | None = None
    skip: str | None = None
    """None (run it), `memory` (predicted not to fit), `slower` (predicted to lose) or `tie` (a
    lever change the probes predict to gain within the tie margin: `tuner.search.proposing.
    drawn`)."""
    reason: str = ""

    @property
    def predicted(self) -> bool:
        """Whether anything was predicted (a study's first trials have nothing to go on)."""
        return self.fits is not None or self.throughput is not None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Known:
    """One trial that ran, as the predictions use it."""

    number: int
    config: LoopConfig
    precision: str | None
    throughput: float | None
    peak_bytes: int | None
    out_of_memory: bool


def known_trials(trials: Iterable[optuna.trial.FrozenTrial]) -> list[_Known]:
    """The study's trials that ran far enough to tell something: measured ones (complete or
    pruned: a screened-out trial's windows are real) and those that ran out of memory."""
    known: list[_Known] = []
    for trial in trials:
        attrs = trial.user_attrs
        if keys.CONFIG not in attrs or trial.state == TrialState.RUNNING:
            continue
        oom = trial.state == TrialState.FAIL and attrs.get(keys.FAILURE_KIND) == "oom"
        median = attrs.get("median")
        if not oom and not isinstance(median, int | float):
            continue
        known.append(
            _Known(
                number=trial.number,
                config=LoopConfig.from_dict(attrs[keys.CONFIG]),
                precision=attrs.get(keys.PRECISION),
                throughput=float(median) if isinstance(median, int | float) else None,
                peak_bytes=attrs.get(keys.PEAK_MEMORY),
                out_of_memory=oom,
            )
        )
    return known


def predict(
    config: LoopConfig,
    precision: str | None,
    known: list[_Known],
    *,
    parameters: int | None,
    device_bytes: int | None,
    incumbent: Incumbent | None,
    margin: float,
) -> Prediction:
    """The prediction for `config` in `precision` (None: the study's) from `known`."""
    memory = _memory(config, precision, known, parameters=parameters, device_bytes=device_bytes)
    speed = _speed(config, precision, known)
    skip_memory, reason = memory.pop("skip_memory", False), memory.pop("reason", "")
    fields: dict[str, Any] = {**memory, **speed}
    if incumbent is not None:
        fields["incumbent"], fields["incumbent_trial"] = incumbent.throughput, incumbent.trial
    prediction = Prediction(**fields)
    if skip_memory:
        return dataclasses.replace(prediction, skip="memory", reason=reason)
    throughput = prediction.throughput
    if (
        throughput is not None
        and incumbent is not None
        and throughput < incumbent.throughput * (1.0 - margin - TIME_SPARE)
    ):
        loss = 1.0 - throughput / incumbent.throughput
        reason = (
            f"predicted {throughput:.3g} samples/s from trial {prediction.time_basis}, "
            f"{loss:.0%} below the incumbent (trial {incumbent.trial}): its recomputation and "
            "micro-batches only add time where the plain step fits"
        )
        return dataclasses.replace(prediction, skip="slower", reason=reason)
    return prediction


def _memory(
    config: LoopConfig,
    precision: str | None,
    known: list[_Known],
    *,
    parameters: int | None,
    device_bytes: int | None,
) -> dict[str, Any]:
    mine = activation_factor(config)
    same = [k for k in known if k.precision == precision]
    ours = family(config, precision)
    # Out of memory while keeping no more activations than this one, in the same family (the
    # other compile scope's peak differs by a few GB: 64.6 against 65.8 GB at 1.1B): this one
    # cannot fit either.
    for k in same:
        relative = family(k.config, k.precision) == ours
        if relative and k.out_of_memory and activation_factor(k.config) <= mine:
            return {
                "fits": False,
                "memory_basis": k.number,
                "skip_memory": True,
                "reason": f"trial {k.number} ran out of memory keeping no more activations",
            }
    measured = [k for k in same if k.peak_bytes]
    if parameters is None or device_bytes is None or not measured:
        return {}
    state = parameters * STATE_BYTES_PER_PARAM
    # The closest basis: one of the same family if any (same compile scope), the latest first.
    basis = max(measured, key=lambda k: (family(k.config, k.precision) == ours, k.number))
    activations = max(0.0, float(basis.peak_bytes or 0) - state) / activation_factor(basis.config)
    peak = state + activations * mine
    reason = (
        f"predicted peak {peak / 1e9:.1f} GB from trial {basis.number} over the device's "
        f"{device_bytes / 1e9:.1f} GB"
    )
    return {
        "peak_bytes": peak,
        "fits": peak <= device_bytes,
        "memory_basis": basis.number,
        "skip_memory": _skips_on_memory(config, ours, peak, basis, measured, state, device_bytes),
        "reason": reason,
    }


def _skips_on_memory(
    config: LoopConfig,
    ours: tuple[Any, ...],
    peak: float,
    basis: _Known,
    measured: list[_Known],
    state: float,
    device_bytes: int,
) -> bool:
    """Whether a memory prediction is firm enough to leave the candidate unrun: over the device
    with MEMORY_SPARE to spare, from a basis of its own family (another compile scope or a graph
    pool keeps memory the factors do not scale), on a model of the state that the basis's peak
    holds, and no trial of its family that fitted kept as many activations or more."""
    if peak <= device_bytes * (1.0 + MEMORY_SPARE):
        return False
    if family(basis.config, basis.precision) != ours or state >= float(basis.peak_bytes or 0):
        return False
    mine = activation_factor(config)
    return not any(
        family(k.config, k.precision) == ours and activation_factor(k.config) >= mine
        for k in measured
    )


def _speed(config: LoopConfig, precision: str | None, known: list[_Known]) -> dict[str, Any]:
    ours = family(config, precision)
    relatives = [
        k for k in known if k.throughput is not None and family(k.config, k.precision) == ours
    ]
    if not relatives:
        return {}
    basis = max(relatives, key=lambda k: k.throughput or 0.0)
    throughput = (basis.throughput or 0.0) * time_factor(basis.config) / time_factor(config)
    return {"throughput": throughput, "time_basis": basis.number}


def check(
    prediction: Mapping[str, Any],
    *,
    out_of_memory: bool,
    throughput: float | None,
    margin: float,
) -> dict[str, bool | None]:
    """Was a run trial's prediction right? `fit`: predicted to fit and did (or not, and did
    not); `order`: predicted to lose to the incumbent by more than `margin`, and did (or not).
    None where nothing was predicted or measured."""
    fits = prediction.get("fits")
    fit_right = None if fits is None else bool(fits) == (not out_of_memory)
    predicted, incumbent = prediction.get("throughput"), prediction.get("incumbent")
    order_right = None
    if predicted is not None and incumbent is not None and throughput is not None:
        limit = incumbent * (1.0 - margin)
        order_right = (predicted < limit) == (throughput < limit)
    return {"fit_right": fit_right, "order_right": order_right}


def not_run(trial: optuna.trial.FrozenTrial) -> bool:
    """A trial pruned unrun on its prediction or as a config measured already
    (`tuner.search.trials.TrialRunner._predict`)."""
    found = trial.user_attrs.get(keys.PREDICTION)
    same = keys.SAME_AS in trial.user_attrs
    return same or (isinstance(found, dict) and found.get("skip") is not None)


def tally(trials: Iterable[optuna.trial.FrozenTrial]) -> dict[str, Any]:
    """The search's record in counts: trials predicted, skipped on a prediction (by reason) or
    as a config an earlier job measured (`skipped_same`), screened out, complete, and how often the
    predictions of trials that ran were right."""
    counts = {
        "predicted": 0,
        "skipped_memory": 0,
        "skipped_slower": 0,
        "skipped_tie": 0,
        "skipped_same": 0,
        "screened_out": 0,
        "complete": 0,
    }
    right = {"fit": [0, 0], "order": [0, 0]}
    for trial in trials:
        attrs = trial.user_attrs
        found = attrs.get(keys.PREDICTION)
        skip = found.get("skip") if isinstance(found, dict) else None
        if isinstance(found, dict) and (
            found.get("fits") is not None or found.get("throughput") or skip == "tie"
        ):
            counts["predicted"] += 1
            if skip in ("memory", "slower", "tie"):
                counts[f"skipped_{skip}"] += 1
        counts["skipped_same"] += keys.SAME_AS in attrs
        screened = attrs.get(keys.SCREEN)
        if isinstance(screened, dict) and screened.get("outcome") == "lost":
            counts["screened_out"] += 1
        if trial.state == TrialState.COMPLETE:
            counts["complete"] += 1
        checked = attrs.get(keys.PREDICTION_CHECK)
        if isinstance(checked, dict):
            for name in ("fit", "order"):
                verdict = checked.get(f"{name}_right")
                if verdict is not None:
                    right[name][0] += int(bool(verdict))
                    right[name][1] += 1
    return counts | {
        "fit_right": right["fit"][0],
        "fit_checked": right["fit"][1],
        "order_right": right["order"][0],
        "order_checked": right["order"][1],
    }
