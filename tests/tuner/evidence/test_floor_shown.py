"""What the recommendation's summary prints: a stored graph floor slower than the recommended step
(a record from before issue 28, when the floor was measured in fp32 whatever the study's
precision) is not printed; a baseline that failed in the final round is, with its reason."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from trainers import LoopConfig
from tuner.evidence import render
from tuner.evidence.recommendation import Floor, Interval, Recommendation
from tuner.store.counting import TrialCounts


def printed(floor: Floor | None = None, **fields: Any) -> str:
    out = io.StringIO()
    rec = Recommendation(
        study="s",
        config=LoopConfig().to_dict(),
        reason="fastest",
        trial_counts=TrialCounts(complete=1),
        gpu_seconds=1.0,
        step_ms=20.853,
        floor=floor,
        **fields,
    )
    render.recommendation(Console(file=out, width=200), rec)
    return out.getvalue()


def test_a_floor_slower_than_the_step_is_not_printed() -> None:
    assert "graph floor" not in printed(Floor(step_ms=163.59, ratio=163.59 / 20.853))
    shown = printed(Floor(step_ms=2.9, ratio=2.9 / 20.853))
    assert "graph floor" in shown and "2.900 ms/step" in shown


def test_a_baseline_that_failed_says_why_instead_of_a_speedup() -> None:
    oom = "oom: out of memory: asked for 3.91 GiB with 2.38 GiB free of 79.18 GiB"
    shown = printed(
        speedup={"seed-baseline": Interval(median=1.5, ci95=(1.4, 1.6))},
        failures={"pytorch-default": oom, "seed-baseline": "not this one: it has a speedup"},
    )
    assert f"vs pytorch-default  failed in the final round: {oom}" in shown
    assert "1.50x" in shown and "not this one" not in shown
    assert "failed in the final round" not in printed()


def test_intervals_too_wide_to_rank_by_are_said() -> None:
    # A busy 2-core CPU gave a ratio CI of 0.28-38.33x; a quiet one 0.98-1.02x.
    wide = printed(
        throughput=Interval(median=1000.0, ci95=(980.0, 1010.0)),
        speedup={"pytorch-default": Interval(median=1.2, ci95=(0.28, 38.33))},
    )
    assert "noise" in wide and "a 95 % CI spans 3171% of its median" in wide
    narrow = printed(
        throughput=Interval(median=1000.0, ci95=(980.0, 1010.0)),
        speedup={"pytorch-default": Interval(median=1.0, ci95=(0.98, 1.02))},
    )
    assert "noise" not in narrow
    # The throughput's own interval counts too.
    assert "noise" in printed(throughput=Interval(median=1000.0, ci95=(700.0, 1300.0)))
