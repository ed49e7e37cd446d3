"""The interleaved measurement the suites share: a harness setting measured by the tuner's own
`Measurer` once per round, every setting in turn before the next round starts (clock and load
drift then hit every setting alike), and the recommendation's throughput over the fastest peer's.

`benchmarks/suite.py` and `benchmarks/peers.py` measure their harness settings this way, with
the same log lines; `benchmarks/peers.py` and `benchmarks/data_parallel.py` rank a
recommendation against their peers with `ratio_vs_fastest`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from trainers import LoopConfig
from tuner.search.measuring.measure import Failure, Measured, Measurer
from tuner.search.measuring.stats import ratio_ci


def windows_ms(measurer: Measurer, measured: Measured) -> list[float]:
    """Each timed window's ms/step, from its samples/s (`Measured.throughputs`): the unit the
    records keep."""
    per_batch = measurer.workload.samples_per_batch
    return [per_batch * 1e3 / t for t in measured.throughputs]


def measure_in_round(
    measurer: Measurer,
    name: str,
    config: LoopConfig,
    *,
    round_index: int,
    log: Callable[[str], None],
    errors: dict[str, str],
    precision: str | None = None,
) -> Measured | None:
    """One run of the setting `name` in round `round_index` (from 0) of an interleaved
    comparison, from the measurer's initial weights; `precision`: the run's, where a job chose
    another than the measurer's (None: the measurer's). A failure is a result: its reason goes to
    `errors[name]` and the log, and None comes back, so the other settings go on."""
    outcome = measurer.measure(config, precision=precision)
    if isinstance(outcome, Failure):
        errors[name] = outcome.reason
        log(f"round {round_index + 1} {name}: {outcome.reason}")
        return None
    log(f"round {round_index + 1} {name} {outcome.step_ms:.3f} ms")
    return outcome


def ratio_vs_fastest(
    peers: Mapping[str, Mapping[str, Any]], rec: Mapping[str, Any]
) -> dict[str, Any]:
    """The recommendation's throughput over the fastest of `peers`' (each with `median_ms` and
    `windows_ms`), with a bootstrap CI."""
    best = min(peers, key=lambda n: peers[n]["median_ms"])
    ratio, low, high = ratio_ci(peers[best]["windows_ms"], rec["windows_ms"])
    return {"best_peer": best, "ratio": ratio, "ci95": [low, high]}
