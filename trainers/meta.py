"""A copy of a model whose weights are meta tensors: what reads only shapes (the FLOP count,
`trainers.flops`; a user's loss checked for its type, `trainers.workloads.checks`) runs a
forward there in no time and no memory, and leaves the model alone. A model that cannot be copied
(it holds a lock, an open file) has no such copy: `meta_copy_or_none`, and those checks skip."""

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


def meta_copy_or_none(model: nn.Module) -> nn.Module | None:
    """`meta_copy(model)`, or None where `model` cannot be deep-copied (a `threading.Lock`, an
    open file or a database handle held as an attribute). The build's checks had ended there in
    `TypeError: cannot pickle '_thread.lock' object`, the tool's copy and not the user's model,
    which a plain loop trains (a probe, 2026-12-07)."""
    try:
        return meta_copy(model)
    except Exception:  # noqa: BLE001 - whatever deepcopy raises for an object it cannot copy
        return None
