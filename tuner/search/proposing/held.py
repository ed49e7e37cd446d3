"""The first stage's float8 corner of the whole model, held until the probes pick its float8
levers.

A study whose trials may run in bf16 and in float8, in a space that offers float8-only levers
(`levers.float8_levers`: the head in float8, which linears are converted), ran its float8 corner
of the whole model with those levers at their defaults, and the second stage then changed them
one at a time. On the Qwen1.5-0.5B shape (one H200, vocabulary 151,936, 583f50a;
docs/benchmarks/raw/gate-where-trained-h200-2026-12-01-583f50a/) that was three whole-model
float8 compiles: 139 s (plain float8, 67.1 samples/s, as fast as bf16), 122 s (the head in
float8 too, 70.7) and 57 s (the head alone, 70.4: a tie), in a job of 880 s. The probes that
picked the second take seconds.

So a float8 corner that compiles the whole model is held (`hold`; stored on the study under
`keys.HELD_CORNERS`) while the float8 corner that compiles each block runs first. Once a float8
trial of the study is complete, the float8 levers' probes run once in float8 (`Prober`, whose
figures the second stage reuses) and each held corner is enqueued with the values of those of
the levers it leaves as a bf16 step runs them (the head in bf16) predicted to save the most
against its own (`release`, `picked`), where that gain passes the tie margin of that trial's
step; else as it was. On the 583f50a figures that is the head in float8 beside every linear
(70.7 samples/s, the pick): one whole-model float8 compile fewer. Where no float8 trial completes
(each screened out, say), the held corners are enqueued as they were once no trial waits and
no float8 trial runs. One worker of a job releases them: the job's own claims where it has
them (`Claims`: the service's workers, under the job's lock), else a claim on the study's
attribute (one older than `CLAIM_STALE_S` is taken over). A program's trials and a
data-parallel study's (no probes run there) hold none; nor does a job that starts from an
earlier study's trials (`tuner.search.earlier`) where one of those ran float8 with the whole
model compiled.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import optuna
from optuna.trial import FrozenTrial, TrialState

import trainers
from tuner.search.proposing.levers import (
    BF16,
    FLOAT8,
    float8_combinations,
    float8_levers,
    settings_of,
    unconverted_levers,
)
from tuner.search.proposing.predictions import Predict, Predictions
from tuner.search.spaces.space import SearchSpace
from tuner.store import keys

if TYPE_CHECKING:
    from torch import nn


def _value(runs: dict[str, Any], name: str) -> Any:
    return runs.get(name, trainers.LEVERS[name].default)


def _scope(space: SearchSpace, params: Mapping[str, Any]) -> str | None:
    """The compile scope of a float8 trial's `params` that compiles (None: not such a trial)."""
    runs = settings_of(space, params)
    if params.get(keys.PRECISION) != FLOAT8 or _value(runs, "compile") == "none":
        return None
    return str(_value(runs, "compile_scope"))


def hold(
    corners: Sequence[dict[str, Any]],
    space: SearchSpace,
    precisions: Sequence[str],
    *,
    probes: bool,
    ran: Sequence[FrozenTrial] = (),
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """`corners` (the first stage's params, each with its precision) as (to enqueue now, to
    hold): the float8 corners that compile the whole model are held where the study's trials
    may run bf16 and float8 (`precisions`), the space offers float8-only levers, the probes can
    run here (`probes`) and the float8 corner that compiles each block runs first. Where a trial
    of the study (`ran`: those copied from an earlier study) ran float8 with the whole model
    compiled, none is held or enqueued: the earlier job measured it as its probes picked."""
    whole = [c for c in corners if _scope(space, c) == "model"]
    now = [c for c in corners if _scope(space, c) != "model"]
    wanted = probes and {BF16, FLOAT8} <= set(precisions) and float8_levers(space, BF16)
    if not wanted or not any(_scope(space, c) == "blocks" for c in now):
        return list(corners), []
    if any(_scope(space, t.params) == "model" for t in ran):
        return now, []
    return now, whole


_CLAIM = f"{socket.gethostname()}:{os.getpid()}"
"""This process, as it claims the release of a study's held corners."""
CLAIM_STALE_S = 600.0
"""A claim older than this was a worker's that died before it released them: taken over."""


class Claims(Protocol):
    """Claims among the processes of one job that the job itself keeps, one at a time
    (`tuner.search.gating.parity.GateClaims`: the service's `JobClaims` takes one under the job's
    lock). Where a job has them they decide who releases the held corners: two workers that each
    wrote the study's attribute and read it back could both read their own, and both probe."""

    def take(self, key: str) -> bool: ...

    def release(self, key: str) -> None: ...


RELEASE_KEY = "held-corners"
"""The key the release is claimed under (`Claims`)."""


def _claimed(held: Any) -> list[dict[str, Any]] | None:
    """The corners a study holds (`keys.HELD_CORNERS`: a list, or a claim on it) that this
    process may release: None where there are none, or another live worker claimed them."""
    if isinstance(held, list):
        return held or None
    if not isinstance(held, dict):
        return None
    mine = held.get("by") == _CLAIM or time.time() - float(held.get("at", 0.0)) > CLAIM_STALE_S
    return (list(held.get("corners") or []) or None) if mine else None


def release(
    study: optuna.Study,
    space: SearchSpace,
    *,
    predict: Predict | None,
    device_type: str,
    model: nn.Module | None = None,
    claims: Claims | None = None,
) -> str | None:
    """Enqueue the corners `study` holds (`hold`), once a float8 trial is complete (the fastest
    one's step sets the least gain), or with none complete once no trial waits and no float8
    trial runs; the progress line (None: nothing held, not yet, or another worker releases
    them). A worker claims them first (the probes take seconds, and each worker of a job would
    probe and pick on its own): through the job's `claims` where given, else on the study's
    attribute (`_claimed`). It lets them go once each is enqueued: a call again after a failure
    (the storage's retry) enqueues what it had not (`skip_if_exists`)."""
    held = _claimed(study.user_attrs.get(keys.HELD_CORNERS))
    if held is None:
        return None
    trials = study.get_trials(deepcopy=False)
    float8 = [t for t in trials if t.params.get(keys.PRECISION) == FLOAT8]
    done = [t for t in float8 if t.state == TrialState.COMPLETE and t.values]
    basis = max(done, key=lambda t: t.values[0], default=None)
    waiting = any(t.state == TrialState.WAITING for t in trials)
    if basis is None and (waiting or any(t.state == TrialState.RUNNING for t in float8)):
        return None  # the float8 corner of each block, or what waits before it, runs first
    if claims is not None:
        if not claims.take(RELEASE_KEY):
            return None  # another live worker of the job releases them
        try:
            # Read again under the claim: the worker that held it may have released them since.
            held = _claimed(study.user_attrs.get(keys.HELD_CORNERS))
            if held is None:
                return None
            return _enqueue(study, space, held, basis, predict, device_type, model)
        finally:
            claims.release(RELEASE_KEY)
    study.set_user_attr(keys.HELD_CORNERS, {"corners": held, "by": _CLAIM, "at": time.time()})
    if _claimed(study.user_attrs.get(keys.HELD_CORNERS)) is None:
        return None  # another worker's claim came after this one's
    return _enqueue(study, space, held, basis, predict, device_type, model)


def _enqueue(
    study: optuna.Study,
    space: SearchSpace,
    held: list[dict[str, Any]],
    basis: FrozenTrial | None,
    predict: Predict | None,
    device_type: str,
    model: nn.Module | None,
) -> str:
    """Enqueue `held`, picked by the probes' predictions after `basis` (the fastest float8
    trial; None: none complete), and let them go; the progress line."""
    predictions = None
    if basis is not None and predict is not None:
        predictions = predict(basis, FLOAT8, unconverted_levers())
    lines = []
    for corner in held:
        params, said = picked(space, corner, predictions, device_type, model)
        study.enqueue_trial(params, skip_if_exists=True)
        lines.append(said)
    study.set_user_attr(keys.HELD_CORNERS, [])
    after = "" if basis is None else f" (probed after trial {basis.number})"
    return f"first stage: the float8 corner of the whole model {'; '.join(lines)}{after}"


def picked(
    space: SearchSpace,
    corner: dict[str, Any],
    predictions: Predictions | None,
    device_type: str,
    model: nn.Module | None = None,
) -> tuple[dict[str, Any], str]:
    """`corner` with the float8 levers' values predicted to save the most against its own,
    where that passes `predictions.floor_ms`; else `corner`. With what the line says of it.

    Only a lever the corner leaves as a bf16 step runs it (at its `unconverted` value: the head
    in bf16) is moved: one it converts (every linear in float8) is measured by the corner itself,
    and its other values by the second stage, whose cuts weigh them against that measurement.
    The probes' ranking of the linears has measured wrong: on the Llama-3.2-1B shape (one
    H200, be21630) they ranked `8M` first, and it ran 2 % behind every linear in float8."""
    if predictions is None:
        return corner, "as it was: no float8 trial completed, or no probe runs here"
    levers = float8_levers(space, BF16)
    current = settings_of(space, corner)
    own = {name: _value(current, name) for name in levers}
    fixed = {n: v for n, v in own.items() if v != trainers.LEVERS[n].unconverted}
    as_was: float | str = "its own levers' values were not among those it runs"
    best: tuple[float, dict[str, Any], dict[str, Any]] | None = None
    for chosen, params, settled in float8_combinations(space, current, levers, device_type, model):
        saved = predictions.saved(settled, chosen)
        if chosen == own:
            as_was = saved
        elif any(chosen[n] != v for n, v in fixed.items()):
            continue
        elif isinstance(saved, float) and (best is None or saved > best[0]):
            best = (saved, chosen, params)
    if isinstance(as_was, str):
        return corner, f"as it was: {as_was}"
    if best is None or best[0] - as_was <= predictions.floor_ms:
        return corner, (
            f"as it was: no other value of {', '.join(n for n in levers if n not in fixed)} "
            "predicted to save more than "
            f"{predictions.floor_ms:.2f} ms a step"
        )
    changes = ", ".join(f"{k}={v}" for k, v in best[1].items() if own[k] != v)
    return best[2], f"with {changes} (predicted {best[0] - as_was:+.2f} ms a step)"
