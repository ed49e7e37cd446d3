"""A trial that the second stage would leave out is not run when it comes up anyway.

The second stage (`tuner.search.proposing.levers`) leaves out a lever's value that the probes
predict to save no more than the tie margin of the leader's step: at best it would tie a config
already measured. The sampler knows nothing of that prediction, and a variant enqueued for an
earlier leader was predicted against that leader, not the one now ahead. On the Qwen2-style
shape (0.49B, vocabulary 151,936; one H200 at 25842a9,
`docs/benchmarks/time-to-answer-h200-2026-12-04-qwen2-25842a9.md`) the stage left out
`float8_linears=none` from the float8 leader (predicted +1.14 ms a step, under the 1.19 ms a
gain must pass), and two trials later the sampler drew that very config: a float8 compile and a
screen, 81 s, that measured it 2.5 % behind, and the cold job ended at 622 s against the 600 s
it aims at.

So a trial whose config is the incumbent's with only levers the probes timed changed, in the
incumbent's precision, is predicted as the stage predicts a variant (each changed lever's
figure at the incumbent's value less its figure at the trial's, summed), and is not run where
that sum is no more than the floor (`Predictions.floor_ms`). A change no probe timed (a memory
lever, the compile scope, another precision), a value a probe could not time, or probes that
have not run yet: it runs. Nothing is probed here: a draw waits for no microbenchmark.

A setting only the second stage sets (`tuner.search.spaces.staged`: the whole-step graph in the
`scale` space) is at the sampler's value in every draw, so against an incumbent the stage gave
another value it always differs there, and no probe prices it. Such a draw is the incumbent's
own leader (the config the stage tried the setting over, which the incumbent beat) with the
levers changed, and it also goes without what the setting gained: it is held against that
leader's figures, and the leader's own config is not run again. At the Qwen2-style shape (one
H200, `docs/benchmarks/time-to-answer-h200-2026-12-04-qwen2-e3c3c83.md`) the graph led, and
two draws ran anyway: the graph's leader with `float8_linears=none` (52 s, screened out), which
the stage had left out at -3.37 ms, and the graph's leader itself (43 s, screened out).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from optuna.trial import FrozenTrial

import trainers
from tuner.search.proposing.predict import Prediction
from tuner.search.proposing.predictions import Predictions
from tuner.search.proposing.screen import Incumbent
from tuner.store import keys


def lever_tie(
    config: Mapping[str, Any],
    precision: str | None,
    leader: FrozenTrial,
    predictions: Predictions,
    staged: Mapping[str, Any] | None = None,
) -> str | None:
    """Why `config` (a `LoopConfig`'s dict) in `precision` is not run: it is `leader`'s (the
    incumbent, a complete trial) with only probed levers changed, predicted to save no more than
    `predictions.floor_ms` a step. `staged`: the settings only the second stage sets, each with
    the value every draw takes (module doc). None: run it."""
    if keys.CONFIG not in leader.user_attrs or leader.user_attrs.get(keys.PRECISION) != precision:
        return None
    ours = trainers.canonical(config)
    theirs = trainers.canonical(leader.user_attrs[keys.CONFIG])
    changed = {name: value for name, value in ours.items() if theirs.get(name) != value}
    without = {
        name: value
        for name, value in changed.items()
        if staged is not None and name in staged and value == staged[name]
    }
    changed = {name: value for name, value in changed.items() if name not in without}
    if not changed and not without:
        return None  # the leader's own config: measured again, as any repeat draw is
    gain = 0.0
    for name, value in changed.items():
        saved = predictions.saved_ms(name, theirs.get(name), value)
        if saved is None:
            return None  # not a lever a probe timed, or a value it could not time
        gain += saved
    if gain > predictions.floor_ms:
        return None
    shown = ", ".join(f"{name}={value}" for name, value in changed.items())
    if without:
        back = ", ".join(f"{name}={value}" for name, value in without.items())
        what = f"with {shown} and " if changed else "with "
        return (
            f"trial {leader.number} {what}{back}: the leader that trial's {', '.join(without)} "
            f"was tried over and beat, predicted {gain:+.2f} ms a step beside it, under the "
            f"{predictions.floor_ms:.2f} ms a gain must pass"
        )
    return (
        f"trial {leader.number} with {shown}: predicted {gain:+.2f} ms a step, under the "
        f"{predictions.floor_ms:.2f} ms a gain must pass (the second stage leaves it out too)"
    )


def judged(
    prediction: Prediction,
    config: Mapping[str, Any],
    precision: str | None,
    trials: Sequence[FrozenTrial],
    against: Incumbent | None,
    known: Callable[[float, str | None], Predictions | None],
    study_precision: str | None,
    staged: Mapping[str, Any] | None = None,
) -> Prediction:
    """`prediction` (`tuner.search.proposing.predict`), skipped as a tie (`skip="tie"`) where it
    runs the trial and `lever_tie` says the stage would leave it out against the incumbent
    (`against`); `known(throughput, precision)`: the probes' figures (`Prober.known`), the
    study's precision (`study_precision`) where trials do not search one; `staged`: as
    `lever_tie` takes it."""
    if prediction.skip is not None or against is None:
        return prediction
    leader = next((t for t in trials if t.number == against.trial), None)
    predictions = known(against.throughput, precision or study_precision)
    if leader is None or predictions is None:
        return prediction
    why = lever_tie(config, precision, leader, predictions, staged)
    if why is None:
        return prediction
    return dataclasses.replace(prediction, skip="tie", reason=why)
