"""The trainers' errors: one small hierarchy, so callers can tell bad input from a failed run."""

from __future__ import annotations


class TrainerError(Exception):
    """Base of every error the training harness raises on purpose."""


class ConfigError(TrainerError, ValueError):
    """A setting is out of range. The message names the field, the value and what is allowed."""

    def __init__(self, field: str, value: object, allowed: str) -> None:
        self.field = field
        self.value = value
        self.allowed = allowed
        super().__init__(f"{field}={value!r} is invalid: allowed {allowed}")


class WorkloadError(TrainerError):
    """A workload cannot be found, built or run as asked (unknown name, bad preset, bad factory).

    `field` names the input at fault ("workload" or "preset") where there is one.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        self.field = field
        super().__init__(message)


class CaptureError(TrainerError):
    """The training step could not be captured in a CUDA graph; the message says why."""


class UnsupportedOnDevice(TrainerError):
    """A setting that the chosen device cannot honour (CUDA graphs on CPU, for instance)."""
