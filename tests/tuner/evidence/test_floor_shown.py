"""A stored graph floor slower than the recommended step (a record from before issue 28, when the
floor was measured in fp32 whatever the study's precision) is not printed."""

from __future__ import annotations

import io

from rich.console import Console

from trainers import LoopConfig
from tuner.evidence import render
from tuner.evidence.recommendation import Floor, Recommendation
from tuner.store.counting import TrialCounts


def printed(floor: Floor) -> str:
    out = io.StringIO()
    rec = Recommendation(
        study="s",
        config=LoopConfig().to_dict(),
        reason="fastest",
        n_trials=TrialCounts(complete=1),
        gpu_seconds=1.0,
        step_ms=20.853,
        floor=floor,
    )
    render.recommendation(Console(file=out, width=200), rec)
    return out.getvalue()


def test_a_floor_slower_than_the_step_is_not_printed() -> None:
    assert "graph floor" not in printed(Floor(step_ms=163.59, ratio=163.59 / 20.853))
    shown = printed(Floor(step_ms=2.9, ratio=2.9 / 20.853))
    assert "graph floor" in shown and "2.900 ms/step" in shown
