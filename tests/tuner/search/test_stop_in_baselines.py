"""A stop asked while the baselines are measured (the service's cancel, a worker's shutdown) is
read after each of their windows and before each baseline, as a trial's: a cancel during the
start baselines had waited for both (91 s on a 2-core CPU, a new API client's trial). Real
Optuna on SQLite, real CPU runs of the tiny MLP."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.tuner.tiny import load, options, sqlite_url
from tuner.errors import Stopped
from tuner.search.study import run_study
from tuner.store import keys


class _Lines:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def start(self, study: str, total: int, resumed: bool) -> None:
        pass

    def phase(self, text: str) -> None:
        self.lines.append(text)


@pytest.mark.parametrize("stop_at", ["pytorch-default", "seed-baseline"])
def test_a_stop_during_a_baseline_cuts_it_and_starts_nothing_more(
    tmp_path: Path, stop_at: str
) -> None:
    storage = sqlite_url(tmp_path)
    said = _Lines()

    def should_stop() -> bool:
        return any(line.startswith(f"baseline {stop_at} ") for line in said.lines)

    with pytest.raises(Stopped, match="stopped on request: 0 trials"):
        run_study(options(storage, "cut", trials=3), progress=said, should_stop=should_stop)
    started = [line for line in said.lines if line.startswith("baseline ")]
    assert started[-1] == f"baseline {stop_at} (start)"
    assert "stopped on request after 0 trials" in said.lines
    study = load(storage, "cut")
    assert not study.trials
    stored = sorted(k.split("/")[1] for k in study.user_attrs if k.startswith(keys.BASELINE_PREFIX))
    # The baseline measured before the stop is kept; the one it cut is not.
    assert stored == ([] if stop_at == "pytorch-default" else ["pytorch-default"])
