"""The tuner's errors: one small hierarchy. Trainer errors pass through unchanged."""

from __future__ import annotations

import os
import traceback

MAX_NAMED = 80
"""Characters of a name or id an error quotes back: a 404 for a 60,000-character path had
echoed all of it."""


def named(value: str) -> str:
    """`value` quoted for an error, cut to MAX_NAMED characters with its length said."""
    if len(value) <= MAX_NAMED:
        return repr(value)
    return f"{value[:MAX_NAMED]!r}... ({len(value):,} characters)"


def users_frame(exc: BaseException) -> str:
    """` at file:line` of the innermost frame outside torch and this project (the user's loss
    or model: an id past an Embedding's size said only "index out of range in self"), else
    empty."""
    import trainers

    ours = (os.path.dirname(trainers.__file__), os.path.dirname(__file__), f"{os.sep}torch{os.sep}")
    frames = traceback.extract_tb(exc.__traceback__)
    theirs = [f for f in frames if not any(part in f.filename for part in ours)]
    return f" at {theirs[-1].filename}:{theirs[-1].lineno}" if theirs else ""


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


class JobNotFound(TunerError, LookupError):
    """No job with that id."""


class JobConflict(TunerError):
    """The job is not in a state that allows the request (e.g. cancelling a finished job)."""


class TooManyQueued(TunerError):
    """The caller already has its limit of queued jobs."""


class SpecError(TunerError, ValueError):
    """A job request the tuner cannot run; `loc` names the field (e.g. ("space", "num_streams"))."""

    def __init__(self, loc: tuple[str, ...], message: str, value: object = None) -> None:
        self.loc = loc
        self.message = message
        self.value = value
        super().__init__(f"{'.'.join(loc)}: {message}")


class Interrupted(TunerError):
    """Ctrl-C: finished trials are stored, the running one is failed as 'interrupted'."""


class Stopped(TunerError):
    """`should_stop` answered True: finished trials are stored, the running one stopped early."""


class GpuBusy(TunerError):
    """Another live worker holds the lease of this GPU."""
