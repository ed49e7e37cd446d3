"""The trainers' errors: one small hierarchy, so callers can tell bad input from a failed run."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class TrainerError(Exception):
    """Base of every error the training harness raises on purpose."""


def did_you_mean(
    word: object,
    choices: Iterable[str],
    suffix: str = "",
    *,
    cutoff: float = 0.6,
    prefix: str = "",
) -> str:
    """ " (did you mean a, b?)" naming the choices closest to `word` (difflib's ratio `cutoff`
    or more), each between `prefix` and `suffix`, or "" when none is close: the hint a one-line
    error puts after the value at fault."""
    if not isinstance(word, str):
        return ""
    # Once each: a name in two lists ("did you mean gpt_neox, gpt_neox?") is one choice.
    close = difflib.get_close_matches(word, list(dict.fromkeys(choices)), n=2, cutoff=cutoff)
    return f" (did you mean {', '.join(prefix + c + suffix for c in close)}?)" if close else ""


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
    `every_config`: the fault is the workload's whatever the loop's settings (a factory that
    builds other weights at each call), so a tuner ends its job on it rather than failing each
    config alike and recommending none. Both survive pickling (BaseException keeps `__dict__`):
    the gate's runs raise it in a child process.
    """

    def __init__(
        self, message: str, *, field: str | None = None, every_config: bool = False
    ) -> None:
        self.field = field
        self.every_config = every_config
        super().__init__(message)


class NonFiniteLoss(TrainerError):
    """A step's loss came back NaN or infinite (`Trainer.fit`, unless `allow_nonfinite`).

    `step` counts from 1, as `Trainer.step` and checkpoint names do; `value` is the loss."""

    def __init__(self, step: int, value: float, trained: int) -> None:
        self.step = step
        self.value = value
        super().__init__(
            f"the loss of step {step} is {value}: training stopped after step {trained}, the "
            "weights updated by it; lower the learning rate or check that step's batch, resume "
            "from a checkpoint written before it, or fit(allow_nonfinite=True) to train on"
        )


class CaptureError(TrainerError):
    """The training step could not be captured in a CUDA graph; the message says why."""


class UnsupportedOnDevice(TrainerError):
    """A setting that the chosen device cannot honour (CUDA graphs on CPU, for instance)."""
