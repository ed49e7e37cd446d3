"""The baselines, measured at the start and every `baseline_every` trials, and their drift.

Each measurement is one study attribute (`keys.BASELINE_PREFIX` + `<name>/<id>`), so concurrent
workers never overwrite each other's. Drift compares a baseline with its own first measurement
on the same device (`where`): clocks and other load move every config alike, and a drift above
`DRIFT_WARNING` is shown.

A stop asked (`stop`: the service's cancel, a worker's shutdown) is read before each baseline
and after each of its windows, as a trial's (a program's run: all along it): a cut measurement is
not stored. A cancel during the start baselines had waited for both, 91 s on a 2-core CPU (a new
API client's trial).
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import optuna

from trainers import LoopConfig, WorkloadError
from tuner.search.measuring.measure import Failure, Measurer
from tuner.search.measuring.stats import drift
from tuner.search.measuring.timing import Clock
from tuner.search.options import BASELINES, DRIFT_WARNING, Progress, Retry
from tuner.store import keys
from tuner.store import storage as studies
from tuner.store.phases import MEASURE

REFERENCE_BASELINE = "pytorch-default"
"""The baseline that is the gate's reference loop (`trainers.REFERENCE`)."""


class Baselines:
    """Measures `BASELINES` on one device and stores each measurement with its drift."""

    def __init__(
        self,
        study: optuna.Study,
        measurer: Measurer,
        *,
        where: str,
        retry: Retry,
        progress: Progress,
        clock: Clock,
        configs: Mapping[str, LoopConfig] | None = None,
        stop: Callable[[], bool] | None = None,
    ) -> None:
        self.study = study
        self.stop = stop
        # `BASELINES`, or their DDP twins in a study of several processes (`baselines_for`).
        self.configs = dict(BASELINES if configs is None else configs)
        self.measurer = measurer
        self.where = where
        self.retry = retry
        self.progress = progress
        self.clock = clock

    def measure(self, phase: str) -> None:
        """Measure every baseline once; `phase` ("start", "drift") is stored with each."""
        previous = self.retry.call(
            lambda: studies.entries(self.study, keys.BASELINE_PREFIX), what="baselines"
        )
        stop = self.stop
        for name, config in self.configs.items():
            if stop is not None and stop():
                return
            self.progress.phase(f"baseline {name} ({phase})")
            outcome = self.measurer.measure(
                config,
                on_window=None if stop is None else lambda index, _: not stop(),
                should_stop=stop,  # a program's run: between its windows too
            )
            self.clock.measured(outcome, MEASURE)
            if stop is not None and stop():
                return  # cut short: not a measurement of this baseline
            entry: dict[str, Any] = {
                "phase": phase,
                "time": now(),
                "at_trial": self._n_trials(),
                "config": config.to_dict(),
                "where": self.where,
            }
            if isinstance(outcome, Failure):
                if phase == "start" and name == REFERENCE_BASELINE and _the_workloads(outcome):
                    # The plainest loop fails on the workload itself: every trial would fail the
                    # same way (a probe, 2026-12-06: each trial compiled, then failed there).
                    raise WorkloadError(
                        f"the PyTorch default loop failed ({_said(outcome)}): the workload "
                        "fails whatever the settings; fix the model, the loss or the data"
                        f"{double_hint(outcome.reason)}, then tune it",
                        field="workload",
                    )
                entry |= {"failure_reason": outcome.reason, "seconds": outcome.seconds}
                # Said now, not only in the summary after every trial (a probe, 2026-12-06).
                said = (outcome.reason.strip().splitlines() or [""])[0]
                self.progress.phase(f"baseline {name} failed: {said[:300]}")
            elif name == REFERENCE_BASELINE and outcome.first_nonfinite is not None:
                # The PyTorch loop itself computes NaN or inf: no config can be judged against
                # it (the gate compares losses), so the job stops before its trials.
                raise WorkloadError(
                    f"the PyTorch default loop's loss is not finite at its step "
                    f"{outcome.first_nonfinite} (of this measurement): the workload computes NaN "
                    "or inf whatever the settings; fix the model, the loss or the data (or a "
                    "learning rate too high), then tune it",
                    field="workload",
                )
            else:
                entry |= outcome.to_attrs()
                first = first_baseline(previous, name, self.where)
                if first is not None:
                    entry["drift"] = drift(first["windows"], outcome.throughputs)
                    if abs(entry["drift"]) > DRIFT_WARNING:
                        self.progress.phase(
                            f"warning: {name} drifted {entry['drift']:+.1%} since the first "
                            "measurement (clocks, other load?)"
                        )
            self._store(f"{keys.BASELINE_PREFIX}{name}/{uuid.uuid4().hex[:10]}", entry)

    def _store(self, key: str, entry: dict[str, Any]) -> None:
        self.retry.call(lambda: self.study.set_user_attr(key, entry), what=f"storing {key}")

    def _n_trials(self) -> int:
        return len(
            self.retry.call(lambda: self.study.get_trials(deepcopy=False), what="reading trials")
        )


def _the_workloads(failure: Failure) -> bool:
    """A failure no setting can change, of the plainest loop run in this process: the workload's
    own checks at run time, or what its model, loss or data raised (not an out-of-memory, a
    device fault, a config refused, nor a host out of memory, which fewer samples a pass fix)."""
    if not failure.in_process:
        return False
    if failure.kind == "error":
        return "allocate memory" not in failure.reason
    return failure.kind == "workload"


def double_hint(reason: str) -> str:
    """The fix of a failure where a float64 tensor met a float32 model (torch says "Double"):
    NumPy arrays give float64. Empty for any other failure."""
    if "Double" not in reason:
        return ""
    return (
        " (a float64 tensor met the model's own dtype: NumPy arrays and torch.from_numpy give "
        "float64; .float() the batch's floating tensors)"
    )


def _said(failure: Failure) -> str:
    """The failure's first line without its kind ("error: ")."""
    first = (failure.reason.strip().splitlines() or [""])[0]
    return first.removeprefix(f"{failure.kind}: ")[:300]


def first_baseline(entries: dict[str, Any], name: str, where: str) -> dict[str, Any] | None:
    """The first measurement of baseline `name` at `where` (entries from before `where` was
    recorded count as anywhere's)."""
    measured = [
        e
        for k, e in entries.items()
        if k.startswith(f"{name}/") and "windows" in e and e.get("where", where) == where
    ]
    return min(measured, key=lambda e: e["time"]) if measured else None


def now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
