"""`Protocol.given`: the measurement protocol of a user's flags (the CLI) or settings (a
worker), one rule for both."""

from __future__ import annotations

import pytest

import trainers
from tuner.search.measuring.measure import Protocol
from tuner.search.proposing.defaults import DEFAULT_WINDOW_STEPS
from tuner.service.settings import WorkerSettings


def test_unset_window_steps_take_the_default_and_given_ones_stay() -> None:
    assert Protocol.given(warmup=2, windows=3, window_steps=None).window_steps == (
        DEFAULT_WINDOW_STEPS
    )
    given = Protocol.given(warmup=2, windows=3, window_steps=7, seed=5)
    assert given == Protocol(warmup=2, windows=3, window_steps=7, seed=5)
    with pytest.raises(trainers.ConfigError, match="window_steps"):
        Protocol.given(warmup=2, windows=3, window_steps=0)


@pytest.mark.parametrize("windows", [1, 0])
def test_fewer_than_two_windows_are_refused_on_the_cli_and_in_a_worker(
    windows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One window gives each config a zero-width interval and a speedup of pure noise."""
    with pytest.raises(trainers.ConfigError, match=r"windows.*a confidence interval needs two"):
        Protocol.given(warmup=2, windows=windows, window_steps=None)
    monkeypatch.setenv("TUNER_MEASURE_WINDOWS", str(windows))
    with pytest.raises(ValueError, match="measure_windows"):
        WorkerSettings()


def test_a_worker_and_the_cli_read_unset_window_steps_alike(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("TUNER_MEASURE_WINDOW_STEPS", raising=False)
    assert WorkerSettings().protocol().window_steps == DEFAULT_WINDOW_STEPS
    monkeypatch.setenv("TUNER_MEASURE_WINDOW_STEPS", "9")
    assert WorkerSettings().protocol().window_steps == 9


@pytest.mark.parametrize(
    ("name", "value"), [("warmup", 1_000_000), ("windows", 100_000), ("window_steps", 10**7)]
)
def test_a_value_past_its_limit_is_refused_on_the_cli_and_in_a_worker(
    name: str, value: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A baseline is measured whole, outside the search budget: `--warmup 1000000` had run on
    with no line for as long as it took."""
    given = {"warmup": 2, "windows": 3, "window_steps": None} | {name: value}
    with pytest.raises(trainers.ConfigError, match=rf"{name}={value} is invalid: allowed an integ"):
        Protocol.given(**given)
    monkeypatch.setenv(f"TUNER_MEASURE_{name.upper()}", str(value))
    with pytest.raises(ValueError, match=f"measure_{name}"):
        WorkerSettings()
    monkeypatch.setenv(f"TUNER_MEASURE_{name.upper()}", str(value // 10))
    WorkerSettings()  # a tenth of it is inside
