"""`LoopConfig`: every concurrency setting of the training loop, typed and validated when built.

The defaults are the PyTorch idiom: one stream, the loss read back every step, no pinning, no
prefetch, no graph. What each setting does on the GPU is documented on its field and, in more
detail, in `trainers/loop.py` where it happens.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal, get_args

from trainers.errors import ConfigError

SyncMode = Literal["synchronize", "event", "query"]
SYNC_MODES: tuple[str, ...] = get_args(SyncMode)

MAX_STREAMS = 4
MAX_PREFETCH = 4
MAX_WORKERS = 32


def _check_int(field: str, value: object, low: int, high: int | None) -> None:
    allowed = f"an integer >= {low}" if high is None else f"an integer in {low}..{high}"
    # bool is an int subclass; True as a stream count is a typo, not a setting.
    if not isinstance(value, int) or isinstance(value, bool):
        raise ConfigError(field, value, allowed)
    if value < low or (high is not None and value > high):
        raise ConfigError(field, value, allowed)


def _check_bool(field: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError(field, value, "true or false")


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class LoopConfig:
    """How the training loop uses streams, syncs and the data pipeline.

    num_streams: 1 = everything on the current stream (the PyTorch idiom); 2 = transfer + compute;
        3 = transfer + forward + backward/optimizer; 4 = two transfer streams used alternately
        (two batches in flight) + forward + backward/optimizer. Under PyTorch's semantics each
        backward kernel runs on the stream of its forward op, so the "backward" stream only makes
        the seed gradient, runs the optimizer step and orders itself after the forward.
    sync_interval: the host waits for the GPU and extracts the losses every N steps.
    sync_mode: `synchronize` = torch.cuda.synchronize() at each sync point; `event` = an event
        recorded on the last stream that does work, Event.synchronize() at each sync point;
        `query` = each loss copied non-blocking into pinned host memory behind an event and
        harvested once Event.query() is true; the host blocks only in the final drain.
    prefetch_depth: batches copied to the device ahead of the step that uses them (0: just in time).
    pin_memory: the DataLoader returns page-locked batches (copies overlap compute only from those).
    non_blocking: host-to-device copies are asynchronous with respect to the host.
    num_workers: DataLoader worker processes (0 = batches are made in the training process).
    cuda_graph: forward + backward + optimizer step captured once in a CUDA graph and replayed.
    """

    num_streams: int = 1
    sync_interval: int = 1
    sync_mode: SyncMode = "synchronize"
    prefetch_depth: int = 0
    pin_memory: bool = False
    non_blocking: bool = False
    num_workers: int = 0
    cuda_graph: bool = False

    def __post_init__(self) -> None:
        _check_int("num_streams", self.num_streams, 1, MAX_STREAMS)
        _check_int("sync_interval", self.sync_interval, 1, None)
        if self.sync_mode not in SYNC_MODES:
            raise ConfigError("sync_mode", self.sync_mode, f"one of {', '.join(SYNC_MODES)}")
        _check_int("prefetch_depth", self.prefetch_depth, 0, MAX_PREFETCH)
        _check_bool("pin_memory", self.pin_memory)
        _check_bool("non_blocking", self.non_blocking)
        _check_int("num_workers", self.num_workers, 0, MAX_WORKERS)
        _check_bool("cuda_graph", self.cuda_graph)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> LoopConfig:
        """Build from a mapping; an unknown key is an error that names it and lists the fields."""
        names = field_names()
        for key in values:
            if key not in names:
                raise ConfigError(key, values[key], f"a LoopConfig field: {', '.join(names)}")
        return cls(**dict(values))

    def replace(self, **changes: Any) -> LoopConfig:
        return LoopConfig.from_dict({**self.to_dict(), **changes})


def field_names() -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(LoopConfig))


REFERENCE = LoopConfig()
"""The parity reference and the `pytorch-default` baseline: 1 stream, synchronize every step."""
