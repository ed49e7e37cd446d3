"""What a loss function must be: called as `loss_fn(model, batch)`, the model first
(`trainers.workloads.checks`, which runs it once on a meta copy of the model, asks here why a
call failed). Each fault below had gone on to fail every step with a traceback from the loop."""

from __future__ import annotations

import inspect
import re
from typing import Any

import torch

from trainers.workloads.base import Workload


def not_the_contract(loss_fn: Any, model: torch.nn.Module, exc: Exception) -> str | None:
    """Why `loss_fn` does not take (model, batch), where `exc` shows it: it takes another number
    of arguments, or used the model as a tensor (a criterion of outputs and targets)."""
    try:
        inspect.signature(loss_fn).bind(model, ())
    except ValueError:  # no signature to read (a builtin)
        pass
    except TypeError:
        parameters = inspect.signature(loss_fn).parameters.values()
        said = ", ".join(str(p.replace(annotation=p.empty)) for p in parameters)
        return f"loss_fn({said}) is called with two arguments, the model and the batch"
    name = re.escape(type(model).__name__)
    used = re.search(rf"\bnot {name}\b|'{name}' object", str(exc))
    if not isinstance(exc, TypeError | AttributeError) or used is None:
        return None
    return (
        "it was given the model where it took a tensor: the loop calls loss_fn(model, batch); "
        "a criterion of (outputs, targets) goes inside one, e.g. "
        "lambda model, batch: criterion(model(batch[0]), batch[1])"
    )


def swapped(workload: Workload, model: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> bool:
    """Whether the loss takes its arguments the other way round: `loss_fn(batch, model)` on the
    meta copy gives a scalar (a swapped signature failed each trial alike, naming no contract)."""
    try:
        loss = workload.loss_fn(tuple(t.to("meta") for t in batch), model)  # type: ignore[arg-type]
    except Exception:  # noqa: BLE001 - any failure: not the swapped contract
        return False
    return isinstance(loss, torch.Tensor) and loss.numel() == 1


ONE_PER_CHANNEL = "Expected more than 1 value per channel when training"
"""What BatchNorm in training says of a batch of one (one value per channel)."""

SHAPES_DISAGREE = re.compile(
    "|".join(
        (
            r"shapes cannot be multiplied",
            r"must have same reduction dim",
            r"must match the size of tensor",
            r"is invalid for input of size",
            r"Expected input batch_size",
            r"expected input with shape",
            r"Invalid channel dimensions",
            r"Sizes of tensors must match",
            r"must be equal to input_size",
            r"Attempting to broadcast a dimension",
            r"number of dimensions in the tensor input does not match",  # permute, 4D mask
            # Float ids into an embedding: no autocast makes indices of them.
            r"'indices' to have one of the following scalar types",
            r"should contain \d+ elements not",
        )
    )
)
"""What torch says, on meta tensors as on real ones, where a model's sizes and its inputs' disagree
(a Linear(32, 4) fed 16 features). Only these: other errors there may be the meta device's own
limits (a `.item()`, an op with no meta kernel), and a check must not refuse what would run."""


def shapes_disagree(said: str) -> bool:
    """Whether torch's message `said` is one of `SHAPES_DISAGREE`'s."""
    return SHAPES_DISAGREE.search(said) is not None
