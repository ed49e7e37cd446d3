"""Sparse gradients (`nn.Embedding(sparse=True)`, `nn.EmbeddingBag(sparse=True)`): what of the
Trainer's step cannot take them, refused at build in one line naming the option. Before, Adam
failed at step 1 inside torch ("Adam does not support sparse gradients"), and gradient
clipping with a page of dispatcher registrations (a user's probe, 2026-12-07)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainers.errors import ConfigError
from trainers.optim import constructor_keywords

SPARSE_MODULES = (nn.Embedding, nn.EmbeddingBag)
LOOP_KEYS = ("fused", "foreach")  # the settings `LoopConfig.optimizer` gives the optimizer


def sparse_weights(model: nn.Module) -> dict[int, str]:
    """id(weight) -> what to call it, for each module whose weight gets a sparse gradient."""
    return {
        id(module.weight): f"module {name or 'the model'!r} ({type(module).__name__}, sparse=True)"
        for name, module in model.named_modules()
        if isinstance(module, SPARSE_MODULES) and module.sparse and module.weight.requires_grad
    }


def check_sparse_gradients(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    clip_grad_norm: float | None,
    device: torch.device,
    loop_optimizer: str = "as-built",
) -> None:
    """ConfigError naming `clip_grad_norm` or `optimizer` where a module gives sparse gradients
    that the step cannot take. The optimizer is asked by a probe, not a list: for each of its
    parameter groups that holds such a weight, one step of its own class under that group's
    settings, over one parameter of 2x2 with a sparse gradient on `device`. Only a refusal
    that names sparse gradients is taken; anything else the probe meets (a class that is not
    built from its settings, a step that needs a closure) is left to the step."""
    weights = sparse_weights(model)
    _check_dense(model, optimizer, weights)
    if not weights:
        return
    where = f"{next(iter(weights.values()))} gives sparse gradients"
    if clip_grad_norm is not None:
        raise ConfigError(
            "clip_grad_norm",
            clip_grad_norm,
            f"None where {where}: clipping by total norm takes dense gradients; or build "
            "the embedding with sparse=False",
        )
    kind = type(optimizer)
    for group in optimizer.param_groups:
        held = [weights[id(p)] for p in group["params"] if id(p) in weights]
        refusal = _refusal(kind, group, device) if held else None
        if refusal is None:
            continue
        as_built = {k: v for k, v in group.items() if k not in LOOP_KEYS}
        if loop_optimizer != "as-built" and _refusal(kind, as_built, device) is None:
            # The loop's own choice (`LoopConfig.optimizer`: fused, foreach) is what refused.
            raise ConfigError(
                "config.optimizer",
                loop_optimizer,
                f"as-built where {held[0]} gives sparse gradients ({kind.__name__} made "
                f"{loop_optimizer} says: {refusal}); or the embedding built with sparse=False",
            )
        raise ConfigError(
            "optimizer",
            kind.__name__,
            f"an optimizer whose step takes sparse gradients where {held[0]} gives them "
            f"({kind.__name__} says: {refusal}): e.g. torch.optim.SGD or Adagrad, without "
            "weight decay on that weight; or the embedding built with sparse=False",
        )


def _refusal(
    kind: type[torch.optim.Optimizer], group: dict[str, Any], device: torch.device
) -> str | None:
    weight = nn.Parameter(torch.zeros(2, 2, device=device))
    weight.grad = torch.sparse_coo_tensor(
        torch.zeros(1, 1, dtype=torch.long, device=device),
        torch.ones(1, 2, device=device),
        (2, 2),
        check_invariants=True,
    )
    takes = constructor_keywords(kind, group)
    settings = {k: v for k, v in group.items() if k != "params" and k in takes}
    try:
        kind([weight], **settings).step()
    except Exception as exc:  # noqa: BLE001 - only a refusal of sparse gradients is this check's
        said = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return said if "sparse" in said.lower() else None
    return None


def _check_dense(
    model: nn.Module, optimizer: torch.optim.Optimizer, sparse: dict[int, str]
) -> None:
    """ConfigError naming `optimizer` where a SparseAdam holds a weight whose gradient is dense:
    its step raises "SparseAdam does not support dense gradients" at step 1 (a probe,
    2026-12-07). The one torch optimizer that takes sparse gradients only."""
    if not isinstance(optimizer, torch.optim.SparseAdam):
        return
    names = {id(p): name for name, p in model.named_parameters()}
    for group in optimizer.param_groups:
        # A frozen weight has no gradient: SparseAdam's step skips it (the review, 2026-12-07).
        held = [p for p in group["params"] if p.requires_grad and id(p) not in sparse]
        dense = [names.get(id(p), "?") for p in held]
        if dense:
            raise ConfigError(
                "optimizer",
                "SparseAdam",
                f"an optimizer that takes the dense gradients of {len(dense)} weights "
                f"({dense[0]!r} first): SparseAdam takes only the sparse ones of "
                "nn.Embedding(sparse=True); use Adam, or SGD or Adagrad beside a sparse embedding",
            )
