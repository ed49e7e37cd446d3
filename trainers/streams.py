"""Which CUDA stream does what, for each `num_streams`.

What each role really does under PyTorch's semantics:
- transfer: host-to-device copies of the next batches. They overlap compute only when the source
  is pinned and the copy is non-blocking; how many copies run at once is set by the GPU's copy
  engines, not by the number of streams. With 4 streams two transfer streams alternate, so two
  batches can be in flight.
- forward: the forward pass. Every backward kernel also runs here, because autograd runs each
  backward op on the stream of its forward op.
- backward: where `loss.backward()` is called and the optimizer steps. Only the seed gradient and
  the optimizer's kernels run on it; it waits for the forward (the loss) and the forward of the
  next step waits for it (the updated weights). So it orders work, it does not split it.

On a CPU every role is None and every stream operation is a no-op.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator

import torch

Stream = torch.cuda.Stream


@dataclasses.dataclass(kw_only=True, slots=True)
class StreamPlan:
    transfer: list[Stream | None]
    forward: Stream | None
    backward: Stream | None

    @classmethod
    def create(cls, num_streams: int, device: torch.device, *, cuda_graph: bool) -> StreamPlan:
        if device.type != "cuda":
            return cls(transfer=[None], forward=None, backward=None)
        if num_streams == 1:
            # The PyTorch idiom: copies, forward, backward and step all on the current stream.
            current = torch.cuda.current_stream(device)
            return cls(transfer=[current], forward=current, backward=current)
        n_transfer = 2 if num_streams == 4 else 1
        transfers: list[Stream | None] = [Stream(device) for _ in range(n_transfer)]
        forward = Stream(device)
        # Under a CUDA graph forward, backward and step are one replay on one stream, so a
        # separate backward stream would have nothing to do.
        split = num_streams >= 3 and not cuda_graph
        backward = Stream(device) if split else forward
        return cls(transfer=transfers, forward=forward, backward=backward)

    @property
    def last(self) -> Stream | None:
        """The stream that does the last work of a step (the optimizer step)."""
        return self.backward

    def compute_streams(self) -> list[Stream]:
        """The distinct streams that read a batch: forward (and backward kernels) and backward."""
        streams: list[Stream] = []
        for stream in (self.forward, self.backward):
            if stream is not None and all(stream != s for s in streams):
                streams.append(stream)
        return streams

    def all_streams(self) -> list[Stream]:
        streams = self.compute_streams()
        for stream in self.transfer:
            if stream is not None and all(stream != s for s in streams):
                streams.append(stream)
        return streams


@contextlib.contextmanager
def on(stream: Stream | None) -> Iterator[None]:
    """Make `stream` current for the block; a no-op for None (CPU)."""
    if stream is None:
        yield
    else:
        with torch.cuda.stream(stream):
            yield


def wait(consumer: Stream | None, producer: Stream | None) -> None:
    """Order `consumer` after all work queued so far on `producer` (no-op on CPU or same stream)."""
    if consumer is not None and producer is not None and consumer != producer:
        consumer.wait_stream(producer)
