"""This process's share of a study's time, by phase (`tuner.store.phases` names them).

A `Clock` starts when the search opens, or where the job began when its caller says (`origin`:
`python -m tuner run` counts its own start, so that the seconds it spends importing PyTorch and
Optuna count towards the job's time aim, as a user's clock counts them). Every timed part adds
its seconds to one phase; the parts never overlap (one thread does them one after another), so
the phases add up to at most the wall time, and `idle` is the rest. `record()` is the session
as stored on the study.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from tuner.search.measuring.measure import Failure, Measured
from tuner.store import keys
from tuner.store.phases import COMPILE, PHASES, with_idle


class Clock:
    """Seconds per phase since this process opened the search (or since `origin`, a
    `time.monotonic()` reading from when the job began)."""

    def __init__(self, origin: float | None = None) -> None:
        self._started = time.monotonic() if origin is None else origin
        self.started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        self.key = f"{keys.TIME_PREFIX}{uuid.uuid4().hex[:10]}"
        self.seconds = dict.fromkeys(PHASES, 0.0)

    def add(self, phases: Mapping[str, float]) -> None:
        for name, seconds in phases.items():
            if name not in self.seconds:
                raise ValueError(f"phase {name!r} is unknown: allowed {', '.join(PHASES)}")
            self.seconds[name] += max(0.0, float(seconds))

    @contextlib.contextmanager
    def timing(self, phase: str) -> Iterator[None]:
        """Time the block into `phase`."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.add({phase: time.perf_counter() - started})

    def measured(self, outcome: Measured | Failure, phase: str) -> dict[str, float]:
        """Add one measurement: its compile seconds to `compile`, the rest to `phase`. Returns
        the split (a trial stores it)."""
        compile_s = 0.0
        if isinstance(outcome, Measured) and outcome.compile is not None:
            compile_s = float(outcome.compile.get("compile_s") or 0.0)
        compile_s = min(compile_s, outcome.seconds)
        split = {COMPILE: compile_s, phase: outcome.seconds - compile_s}
        self.add(split)
        return split

    @property
    def wall_s(self) -> float:
        return time.monotonic() - self._started

    def record(self) -> dict[str, Any]:
        """The session as stored on the study (`keys.TIME_PREFIX` + its id)."""
        wall = self.wall_s
        return {"started": self.started, "wall_s": wall, "phases": with_idle(wall, self.seconds)}
