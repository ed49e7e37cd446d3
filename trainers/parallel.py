"""Data parallelism inside the loop core: the model wrapped in DDP or sharded by FSDP2, and each
process's shard of the global batch.

`DataParallel.create(config, device)` is built once per run by `trainers.core.Engine`, so a lever
is written once and both the tuner's measured runs and `Trainer.fit` get it:
- `wrap(model, workload)`: `parallel='ddp'`: `DistributedDataParallel` with the config's bucket
  size, gradient views and static graph; `parallel='fsdp2'`: `fully_shard` of each repeated block
  (`trainers.blocks`) and then of the model, with the config's resharding and, when asked, each
  block told which block to prefetch next (forward) and before (backward);
- `shard(batches)`: every process reads the same global batches (same dataset, same order) and
  keeps its own contiguous slice of each, before the copy to the device (only the shard crosses
  the bus). With equal shards and a mean loss, the mean of the shards' gradients, which DDP's
  all-reduce and FSDP2's reduce-scatter compute, is the gradient of the global batch;
- `sync_skipper(step_model)`: with several micro-batches per step, the context each one but the
  last runs under, so the gradients are communicated once per step (as users write it: DDP's
  `no_sync()`, FSDP2's `set_requires_gradient_sync(False)`).

The process group must already be up (`trainers.distributed` starts it under torchrun).
`parallel='none'` is the identity: nothing is wrapped or sliced.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch import nn

from trainers.blocks import blocks_of, has_blocks
from trainers.config import LoopConfig
from trainers.errors import ConfigError
from trainers.workloads.base import Batch, Workload

if TYPE_CHECKING:
    from torch.distributed.fsdp import FSDPModule

NPROC_FIELD = "nproc_per_node"
"""The setting the world size comes from, named in the errors a user can meet."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataParallel:
    """This process's place in the data-parallel run: its rank among `world` processes."""

    config: LoopConfig
    device: torch.device
    rank: int = 0
    world: int = 1

    @classmethod
    def create(cls, config: LoopConfig, device: torch.device) -> DataParallel:
        """ConfigError naming `parallel` when it asks for a process group that is not up."""
        if config.parallel == "none":
            return cls(config=config, device=device)
        if not (dist.is_available() and dist.is_initialized()):
            raise ConfigError(
                "parallel",
                config.parallel,
                "'none' outside a torchrun launch (data parallelism runs one process per device: "
                "python -m tuner run --nproc-per-node N, or trainers.distributed under torchrun)",
            )
        return cls(config=config, device=device, rank=dist.get_rank(), world=dist.get_world_size())

    @property
    def active(self) -> bool:
        return self.config.parallel != "none"

    def check_workload(self, workload: Workload) -> None:
        """ConfigError naming the setting a workload cannot take (explicit prefetch needs
        blocks; the global batch must split evenly over the processes)."""
        if self.config.fsdp_prefetch:
            blocks_of(workload, field="fsdp_prefetch", value=True)  # raises without blocks
        size = workload.samples_per_batch
        if self.active and size % self.world:
            raise ConfigError(
                NPROC_FIELD,
                self.world,
                f"a divisor of the global batch ({workload.name} {workload.preset} has "
                f"{size} samples per batch: each process trains on an equal shard)",
            )

    def wrap(self, model: nn.Module, workload: Workload) -> nn.Module:
        """The module the step calls: `model` itself, its DDP wrapper, or `model` sharded in
        place by FSDP2 (its parameters become DTensor shards: build the optimizer after this)."""
        if self.config.parallel == "ddp":
            return self._ddp(model)
        if self.config.parallel == "fsdp2":
            return self._fsdp2(model, workload)
        return model

    def _ddp(self, model: nn.Module) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        config = self.config
        return DistributedDataParallel(
            model,
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
            bucket_cap_mb=float(config.bucket_cap_mb),
            gradient_as_bucket_view=config.gradient_as_bucket_view,
            static_graph=config.static_graph,
        )

    def _fsdp2(self, model: nn.Module, workload: Workload) -> nn.Module:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import FSDPModule, fully_shard

        config = self.config
        mesh = init_device_mesh(self.device.type, (self.world,))
        blocks = (
            blocks_of(workload, field="parallel", value="fsdp2") if has_blocks(workload) else []
        )
        # Each block its own unit (its all-gather and reduce-scatter), the rest with the root:
        # the parameters of one block at a time are gathered, as torchtitan shards a decoder.
        for block in blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=config.reshard_after_forward)
        # The root keeps its parameters after the forward (FSDP2 does so for the root anyway):
        # its backward starts at once.
        fully_shard(model, mesh=mesh, reshard_after_forward=config.reshard_after_forward)
        if config.fsdp_prefetch and len(blocks) > 1:
            units = [b for b in blocks if isinstance(b, FSDPModule)]
            # Issue the next block's all-gather when this block's forward starts, and the
            # previous block's when this block's backward starts: the gathers run on FSDP2's
            # all-gather stream under this block's compute instead of after it.
            for current, following in itertools.pairwise(units):
                current.set_modules_to_forward_prefetch([following])
                following.set_modules_to_backward_prefetch([current])
        return model

    def shard(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        """This process's slice of each global batch (all of it without data parallelism)."""
        if not self.active or self.world == 1:
            return batches
        return (shard_batch(batch, self.rank, self.world) for batch in batches)


SyncSkipper = Callable[[], contextlib.AbstractContextManager[object]]
"""A context under which a micro-batch's forward and backward leave the gradients unreduced."""


def sync_skipper(step_model: nn.Module) -> SyncSkipper | None:
    """The context that defers the gradient reduction of `step_model` (what the step calls: DDP,
    an FSDP2 root, or either compiled around it), or None for a model that reduces nothing.

    DDP: `no_sync()`. Its flag is read in DDP's own forward (run eagerly under Dynamo too), which
    then does not arm the reducer: the backward accumulates into `.grad` locally and no bucket is
    all-reduced. The next forward outside the context arms it again, and that backward all-reduces
    the sum of every micro-batch's gradients, the same mean the per-micro-batch all-reduces sum.
    FSDP2: `set_requires_gradient_sync(False)` on the root and every unit under it: each block
    keeps its unsharded gradient (more memory, a block's full gradient per block) instead of
    reduce-scattering it, and the last micro-batch's backward reduce-scatters the sum.
    """
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    inner = getattr(step_model, "_orig_mod", step_model)  # torch.compile's wrapper
    if isinstance(inner, DistributedDataParallel):
        return inner.no_sync
    if isinstance(inner, FSDPModule):
        return functools.partial(_fsdp_without_sync, inner)
    return None


@contextlib.contextmanager
def _fsdp_without_sync(root: FSDPModule) -> Iterator[None]:
    # recurse=True (the default): every block is its own FSDP2 unit with its own flag.
    root.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        root.set_requires_gradient_sync(True)


def shard_batch(batch: Batch, rank: int, world: int) -> Batch:
    """Rank `rank`'s contiguous slice of `batch` (views, no copy) along the first dimension.
    ConfigError naming `nproc_per_node` when a tensor's first dimension does not split evenly."""
    pieces = []
    for tensor in batch:
        if tensor.dim() == 0 or tensor.shape[0] % world:
            size = "a scalar" if tensor.dim() == 0 else f"first dimension {tensor.shape[0]}"
            raise ConfigError(
                NPROC_FIELD,
                world,
                f"a divisor of the global batch (a batch tensor has {size}; every tensor of a "
                "batch must have the samples along its first dimension)",
            )
        share = tensor.shape[0] // world
        pieces.append(tensor[rank * share : (rank + 1) * share])
    return tuple(pieces)


def parameter_digest(model: nn.Module) -> list[float]:
    """One float64 sum per parameter of the whole (unsharded) model, in registration order: what
    the ranks compare to show their replicas agree. A DTensor shard (FSDP2) is gathered first, a
    collective every rank must join."""
    digest = []
    with torch.no_grad():
        for param in model.parameters():
            full = param.full_tensor() if hasattr(param, "full_tensor") else param
            digest.append(float(full.detach().double().sum().item()))
    return digest
