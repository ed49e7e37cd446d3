"""The one-line errors a job stores: a failure naming its request field, and a decision that
recommends no config."""

from __future__ import annotations

import trainers
from tuner.errors import SpaceError, TunerError
from tuner.evidence.recommendation import Recommendation


def describe(exc: BaseException) -> str:
    """One line for a job's `error`, naming the request field where there is one."""
    if isinstance(exc, trainers.ConfigError):
        return f"{exc.field}: {exc}"
    if isinstance(exc, trainers.WorkloadError):
        return f"{exc.field or 'workload'}: {exc}"
    if isinstance(exc, SpaceError):
        return f"space/fix: {exc}"
    if isinstance(exc, TunerError | trainers.TrainerError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"[:2000]


def no_config(rec: Recommendation) -> str:
    """A job's error where it recommends no config: the reason and each final-round failure
    (the row has no `failures` of its own: "(see failures)" pointed nowhere a client reads)."""
    reason = (rec.reason or "none was decided").removesuffix(" (see failures)")
    failed = [f"{name}: {' '.join(why.split())[:300]}" for name, why in rec.failures.items()]
    return f"no config recommended: {reason}" + (f" ({'; '.join(failed[:4])})" if failed else "")
