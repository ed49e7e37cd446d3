"""`Protocol`: how a search measures each config (warm-up, windows, steps per window, seed).

A word of the request, beside `tuner.search.options` (`tuner.request` is the request): the options
hold one, the measurement (`tuner.search.measuring.measure`, which re-exports it) reads it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import trainers
from trainers import LoopConfig
from tuner.search.proposing.defaults import DEFAULT_WARMUP, DEFAULT_WINDOW_STEPS, DEFAULT_WINDOWS

__all__ = ["LIMITS", "Protocol"]

LIMITS: dict[str, tuple[int, int]] = {
    "warmup": (0, 100_000),
    "windows": (2, 10_000),
    "window_steps": (1, 1_000_000),
}
"""Each measurement setting's allowed range, for the CLI's flags and a worker's settings alike.
The highs catch a typo: a baseline is measured whole, outside the search budget, so `--warmup
1000000` ran on with no line for as long as it took."""


@dataclasses.dataclass(kw_only=True, frozen=True)
class Protocol:
    warmup: int = DEFAULT_WARMUP
    windows: int = DEFAULT_WINDOWS
    window_steps: int = DEFAULT_WINDOW_STEPS
    seed: int = 0

    def __post_init__(self) -> None:
        # Two windows at least: a config's confidence interval is read from its windows, and
        # one window gave a zero-width interval and a speedup of pure noise (81x, 2026-12-04).
        for name, (low, high) in LIMITS.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                why = " (a confidence interval needs two windows)" if name == "windows" else ""
                raise trainers.ConfigError(name, value, f"an integer from {low} to {high}{why}")

    @classmethod
    def given(
        cls, *, warmup: int, windows: int, window_steps: int | None, seed: int = 0
    ) -> Protocol:
        """The protocol of a user's flags or settings: `window_steps` None is the default
        (`DEFAULT_WINDOW_STEPS`), which a search may then lengthen for the scale space
        (`RunOptions.auto_window_steps`)."""
        steps = DEFAULT_WINDOW_STEPS if window_steps is None else window_steps
        return cls(warmup=warmup, windows=windows, window_steps=steps, seed=seed)

    def warmup_for(self, config: LoopConfig) -> int:
        # Graph capture and compilation stay out of the timing (trainers.min_warmup says how).
        return max(self.warmup, trainers.min_warmup(config))

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
