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
