"""A copy of a model whose weights are meta tensors: what reads only shapes (the FLOP count,
`trainers.flops`; a user's loss checked for its type, `trainers.workloads.checks`) runs a
forward there in no time and no memory, and leaves the model alone."""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn


def meta_copy(model: nn.Module) -> nn.Module:
    """A copy of `model` whose parameters and buffers are meta tensors of the same shapes and
    dtypes (tied ones still tied): nothing is copied from them, and whatever a forward caches on
    the copy stays off `model`."""
    memo: dict[int, Any] = {}
    for tensor in (*model.parameters(), *model.buffers()):
        if id(tensor) not in memo:
            meta = torch.empty_like(tensor, device="meta")
            if isinstance(tensor, nn.Parameter):
                meta = nn.Parameter(meta, requires_grad=tensor.requires_grad)
            memo[id(tensor)] = meta
    return copy.deepcopy(model, memo)
