"""What `python -m tuner run` prints while it works, on stderr: plain lines or a live bar.

- `PlainProgress`, where stderr is not a terminal (CI, `nohup`, a pipe, a file): one line per
  phase and per trial, each with the seconds since the run started, flushed at once, so a log
  shows where a run is while it runs (a live bar is drawn only at its end there, if at all);
- `LiveProgress`, on a terminal: rich's bar, trial n of N, the fastest trial so far, elapsed;
- `--quiet`: neither (`tuner.search.options.Quiet`).

Both tell the search's figures from the final one apart: a trial's samples/s is one short
measurement, and the recommendation is decided by the final round, which measures the best
configs again, interleaved. The last line (`finish`) gives the final round's figure, the one the
summary prints, so the progress never ends on a figure the summary disagrees with.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from tuner.store.phases import LABELS

if TYPE_CHECKING:  # imported when used: `python -m tuner run` prints its first line before torch
    from tuner.evidence.recommendation import Recommendation


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrialReport:
    """One finished trial as the search tells it (`tuner.search.options.TrialReporter`)."""

    number: int
    """Optuna's trial number in the study."""
    done: int
    """Trials this process has run, this one included."""
    total: int
    """Trials this process may run at most."""
    state: str
    """complete, pruned, failed, or finished elsewhere."""
    config: Mapping[str, Any] | None
    """The trial's `LoopConfig` as a dict; None for a combination the harness refused."""
    value: float | None
    """A complete trial's samples/s (the median of its windows, pooled with a duplicate's)."""
    reason: str | None
    """Why it failed or was pruned."""
    seconds: float
    """Its wall time in this process: measurement, compile, gate and profile."""
    phases: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Its own phase times (`tuner.store.keys.TIME`)."""
    best: float | None = None
    """The fastest complete trial of the study so far, samples/s."""
    precision: str | None = None
    """The trial's precision in a study searching precisions (None: the study's)."""


def _words(name: str, value: Any) -> str | None:
    """One setting that differs from the PyTorch default, in a few words."""
    named: dict[str, Callable[[Any], str]] = {
        "num_streams": lambda v: f"{v} streams",
        "prefetch_depth": lambda v: f"prefetch {v}",
        "pin_memory": lambda v: "pinned" if v else "unpinned",
        "non_blocking": lambda v: "non-blocking" if v else "blocking",
        "num_workers": lambda v: f"{v} worker" + ("" if v == 1 else "s"),
        "cuda_graph": lambda v: "whole-step graph" if v else "no graph",
        "compile": lambda v: f"compile {v}",
        "optimizer": lambda v: f"{v} optimizer",
        "micro_batches": lambda v: f"{v} micro-batches",
        "activation_checkpointing": lambda v: f"checkpointing {v}",
        "checkpoint_share": lambda v: f"checkpoint share {v:g}",
        "compile_scope": lambda v: f"compile scope {v}",
    }
    if name in named:
        return named[name](value)
    return f"{name}={value}"


def short_config(config: Mapping[str, Any] | None) -> str:
    """A config in a few words: only what differs from the PyTorch default (`LoopConfig()`)."""
    import trainers  # here, not at the top: see the imports

    if config is None:
        return "refused combination"
    default = trainers.LoopConfig().to_dict()
    parts: list[str] = []
    interval, mode = config.get("sync_interval", 1), config.get("sync_mode", "synchronize")
    if (interval, mode) != (default["sync_interval"], default["sync_mode"]):
        parts.append(f"{mode} every {interval}")
    for name, value in config.items():
        if name in ("sync_interval", "sync_mode") or value == default.get(name, value):
            continue
        word = _words(name, value)
        if word is not None:
            parts.append(word)
    return ", ".join(parts) or "PyTorch default"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def trial_line(report: TrialReport) -> str:
    """`trial 3 (4/10) complete: 3,075.5 samples/s [2 streams, event every 10] in 1.9 s; ...`"""
    head = f"trial {report.number} ({report.done}/{report.total}) {report.state}"
    if report.state == "complete" and report.value is not None:
        head += f": {report.value:,.1f} samples/s"
    elif report.reason:
        head += f": {_one_line(report.reason)}"
    spent = [
        f"{LABELS.get(k, k)} {s:.1f} s" for k, s in report.phases.items() if float(s or 0) >= 0.05
    ]
    took = f"in {report.seconds:.1f} s" + (f" ({', '.join(spent)})" if spent else "")
    best = "" if report.best is None else f"; fastest trial so far {report.best:,.1f} samples/s"
    shown = short_config(report.config)
    if report.precision is not None:
        shown = f"{shown}, {report.precision}"
    return f"{head} [{shown}] {took}{best}"


def final_line(rec: Recommendation) -> str:
    """The last progress line: the final round's figure, the one the summary shows."""
    if rec.config is None:
        return f"done: no recommendation ({_one_line(rec.reason or 'none was decided')})"
    figure = "" if rec.throughput is None else f" at {rec.throughput.median:,.1f} samples/s"
    shown = short_config(rec.config)
    if rec.precisions:
        shown = f"{shown}, {rec.precision}"
    return (
        f"done: recommended {rec.source} [{shown}]{figure} "
        "(final round; each trial above was one short measurement)"
    )


class PlainProgress:
    """One flushed line per phase and per trial, each stamped with the seconds since `started`
    (a `time.monotonic()` reading: when the command began)."""

    def __init__(self, stream: TextIO, *, started: float | None = None) -> None:
        self._stream = stream
        self._started = time.monotonic() if started is None else started

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        pass

    def line(self, text: str) -> None:
        elapsed = time.monotonic() - self._started
        self._stream.write(f"[{elapsed:7.1f} s] {text}\n")
        self._stream.flush()

    def start(self, study: str, total: int, resumed: bool) -> None:
        verb = "resuming study" if resumed else "new study"
        self.line(f"{verb} {study}: up to {total} trials")

    def phase(self, text: str) -> None:
        self.line(text)

    def trial_report(self, report: TrialReport) -> None:
        self.line(trial_line(report))

    def trial_done(self, done: int, total: int, best: float | None, state: str) -> None:
        pass  # `trial_report` printed the trial's line

    def finish(self, rec: Recommendation) -> None:
        self.line(final_line(rec))


class LiveProgress:
    """The live bar of `python -m tuner run` on a terminal: trial n of N, the fastest trial so
    far, elapsed, the current phase; at the end, the final round's figure."""

    def __init__(self, console: Console) -> None:
        self._progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[best]}"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[status]}"),
            console=console,
        )
        self._task: Any = None

    def __enter__(self) -> LiveProgress:
        # The bar is drawn from `start` on: an input error before it is the only line printed.
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._task is not None:
            self._progress.stop()

    def line(self, text: str) -> None:
        self._progress.console.print(text)

    def start(self, study: str, total: int, resumed: bool) -> None:
        self._progress.start()
        verb = "resuming" if resumed else "study"
        self._task = self._progress.add_task(
            f"{verb} {study}", total=total, best="fastest trial -", status=""
        )

    def phase(self, text: str) -> None:
        if self._task is not None:
            self._progress.update(self._task, status=text)

    def trial_report(self, report: TrialReport) -> None:
        pass  # the bar shows the count and the fastest trial (`trial_done`)

    def trial_done(self, done: int, total: int, best: float | None, state: str) -> None:
        shown = "fastest trial -" if best is None else f"fastest trial {best:,.1f} samples/s"
        self._progress.update(self._task, completed=done, best=shown, status=f"last: {state}")

    def finish(self, rec: Recommendation) -> None:
        """The bar's last state: the figure the summary prints, not the fastest trial."""
        if self._task is None:
            return
        shown = (
            "no recommendation"
            if rec.config is None or rec.throughput is None
            else f"recommended {rec.throughput.median:,.1f} samples/s (final round)"
        )
        self._progress.update(self._task, best=shown, status="done")


class Silent:
    """`--quiet`: no progress at all (the summary or the JSON is still printed)."""

    def __enter__(self) -> Silent:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        pass

    def line(self, text: str) -> None:
        pass

    def start(self, study: str, total: int, resumed: bool) -> None:
        pass

    def phase(self, text: str) -> None:
        pass

    def trial_report(self, report: TrialReport) -> None:
        pass

    def trial_done(self, done: int, total: int, best: float | None, state: str) -> None:
        pass

    def finish(self, rec: Recommendation) -> None:
        pass


def for_terminal(
    *, quiet: bool, stdout: TextIO, stderr: TextIO, started: float | None = None
) -> PlainProgress | LiveProgress | Silent:
    """The progress `python -m tuner run` draws on `stderr`: none with `quiet`; a live bar when
    both streams are terminals (someone is watching); else plain lines, which a log, a pipe or
    `nohup` keeps in order (a redirected stdout often means stderr goes to the same file)."""
    if quiet:
        return Silent()
    if stdout.isatty() and stderr.isatty():
        return LiveProgress(Console(file=stderr))
    return PlainProgress(stderr, started=started)
