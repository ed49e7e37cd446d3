"""Sparse gradients (`nn.Embedding(sparse=True)`, `nn.EmbeddingBag(sparse=True)`): what of the
Trainer's step cannot take them, refused at build in one line naming the option. Before, Adam
failed at step 1 inside torch ("Adam does not support sparse gradients"), and gradient
clipping with a page of dispatcher registrations (a user's probe, 2026-12-07)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainers.errors import ConfigError

SPARSE_MODULES = (nn.Embedding, nn.EmbeddingBag)


def sparse_modules(model: nn.Module) -> list[str]:
    """The names of the modules whose weight gets a sparse gradient."""
    return [
        f"module {name or 'the model'!r} ({type(module).__name__}, sparse=True)"
        for name, module in model.named_modules()
        if isinstance(module, SPARSE_MODULES) and module.sparse and module.weight.requires_grad
    ]


def check_sparse_gradients(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    clip_grad_norm: float | None,
    device: torch.device,
) -> None:
    """ConfigError naming `clip_grad_norm` or `optimizer` where a module gives sparse gradients
    that the step cannot take. The optimizer is asked by a probe, not a list: one step of its
    own class, with its own settings, over one parameter of 2x2 with a sparse gradient on
    `device`. Only its refusal of sparse gradients is taken; anything else the probe meets (a
    class that is not built from its `defaults`) is left to the step."""
    names = sparse_modules(model)
    if not names:
        return
    where = f"{names[0]} gives sparse gradients"
    if clip_grad_norm is not None:
        raise ConfigError(
            "clip_grad_norm",
            clip_grad_norm,
            f"None where {where}: clipping by total norm takes dense gradients; or build "
            "the embedding with sparse=False",
        )
    refusal = _refusal(type(optimizer), optimizer.defaults, device)
    if refusal is not None:
        raise ConfigError(
            "optimizer",
            type(optimizer).__name__,
            f"an optimizer that takes sparse gradients where {where} (torch.optim.SGD, "
            f"SparseAdam or Adagrad; {type(optimizer).__name__} says: {refusal}); or build the "
            "embedding with sparse=False",
        )


def _refusal(
    kind: type[torch.optim.Optimizer], defaults: dict[str, Any], device: torch.device
) -> str | None:
    weight = nn.Parameter(torch.zeros(2, 2, device=device))
    weight.grad = torch.sparse_coo_tensor(
        torch.zeros(1, 1, dtype=torch.long, device=device),
        torch.ones(1, 2, device=device),
        (2, 2),
        check_invariants=True,
    )
    try:
        kind([weight], **defaults).step()
    except (RuntimeError, ValueError, TypeError) as exc:
        said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return said if "sparse" in said.lower() else None
    return None
