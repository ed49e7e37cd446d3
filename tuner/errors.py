"""The tuner's errors: one small hierarchy. Trainer errors pass through unchanged."""

from __future__ import annotations


class TunerError(Exception):
    """Base of every error the tuner raises on purpose."""


class SpaceError(TunerError, ValueError):
    """A search-space file, range or `--fix` pin is invalid; the message names it."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}={value!r} is invalid: allowed {allowed}")


class StudyNotFound(TunerError, LookupError):
    """No study of that name in the storage."""


class NoRecommendation(TunerError):
    """The study has no finished, parity-checked trial to recommend yet."""
