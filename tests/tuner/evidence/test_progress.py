"""What `python -m tuner run` prints while it works (`tuner.evidence.progress`), on real streams:
a file, and a pseudo-terminal for the live bar."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from typing import TextIO

import pytest
from rich.console import Console

from trainers import LoopConfig
from tuner.evidence import progress
from tuner.evidence.recommendation import Interval, Recommendation
from tuner.store.counting import TrialCounts


def recommendation(median: float) -> Recommendation:
    config = LoopConfig(num_streams=2, sync_mode="event", sync_interval=10, prefetch_depth=2)
    return Recommendation(
        study="s",
        config=config.to_dict(),
        reason=None,
        trial_counts=TrialCounts(complete=3),
        gpu_seconds=1.0,
        source="trial-2",
        throughput=Interval(median=median, ci95=(median * 0.9, median * 1.1)),
    )


@pytest.fixture
def terminal() -> Iterator[TextIO]:
    """The writing end of a real pseudo-terminal (`isatty()` is true)."""
    leader, follower = os.openpty()
    stream = os.fdopen(follower, "w")
    try:
        yield stream
    finally:
        stream.close()
        os.close(leader)


def test_a_config_in_short_names_only_what_differs_from_the_pytorch_default() -> None:
    graph = LoopConfig(num_streams=2, sync_mode="event", sync_interval=10, cuda_graph=True)
    assert progress.short_config(graph.to_dict()) == "event every 10, 2 streams, whole-step graph"
    assert progress.short_config(LoopConfig(num_workers=1).to_dict()) == "1 worker"
    assert progress.short_config(LoopConfig().to_dict()) == "PyTorch default"
    assert progress.short_config(None) == "refused combination"


def test_a_trial_line_has_number_config_result_and_seconds() -> None:
    report = progress.TrialReport(
        number=7,
        done=3,
        total=10,
        state="failed",
        config=LoopConfig(cuda_graph=True).to_dict(),
        value=None,
        reason="out of memory:\n  tried to allocate 2 GiB",
        seconds=12.34,
        phases={"measure": 10.0, "compile": 0.01, "gate_config": 2.0},
        best=1234.5,
    )
    assert progress.trial_line(report) == (
        "trial 7 (3/10) failed: out of memory: tried to allocate 2 GiB [whole-step graph] in "
        "12.3 s (measurement 10.0 s, gate: config run 2.0 s); fastest trial so far 1,234.5 "
        "samples/s"
    )


def test_plain_lines_are_stamped_and_flushed_one_per_call() -> None:
    sink = io.StringIO()
    plain = progress.PlainProgress(sink)
    plain.start("s", 10, resumed=False)
    plain.phase("baseline pytorch-default (start)")
    plain.trial_done(1, 10, 5.0, "complete")  # the trial's line is trial_report's
    plain.finish(recommendation(56.92))
    lines = sink.getvalue().splitlines()
    assert len(lines) == 3
    assert all(line.startswith("[") and " s] " in line for line in lines)
    assert lines[0].endswith("new study s: up to 10 trials")
    assert lines[2].endswith(
        "done: recommended trial-2 [event every 10, 2 streams, prefetch 2] at 56.9 samples/s "
        "(final round; each trial above was one short measurement)"
    )


def test_the_live_bar_ends_on_the_final_figure_not_the_fastest_trial(terminal: TextIO) -> None:
    """issue 29: a log's last progress line read `best 114.1 sa...` beside a final 56.92."""
    sink = io.StringIO()
    console = Console(file=sink, force_terminal=True, width=200)
    with progress.LiveProgress(console) as live:
        live.start("s", 3, resumed=False)
        live.trial_done(3, 3, 114.1, "complete")
        live.finish(recommendation(56.92))
    last = sink.getvalue().rsplit("\r", 1)[-1]
    assert "recommended 56.9 samples/s (final round)" in last
    assert "114.1" not in last


def test_which_progress_for_which_streams(terminal: TextIO) -> None:
    log = io.StringIO()
    assert isinstance(
        progress.for_terminal(quiet=False, stdout=log, stderr=log), progress.PlainProgress
    )
    # A terminal on stderr but stdout redirected (`> out.txt`): plain lines, in order.
    assert isinstance(
        progress.for_terminal(quiet=False, stdout=log, stderr=terminal), progress.PlainProgress
    )
    assert isinstance(
        progress.for_terminal(quiet=False, stdout=terminal, stderr=terminal),
        progress.LiveProgress,
    )
    assert isinstance(
        progress.for_terminal(quiet=True, stdout=terminal, stderr=terminal), progress.Silent
    )
