"""The optimizer a run steps with: the workload's own, rebuilt foreach or fused, or compiled.

Rebuilding keeps everything the factory chose (the optimizer class, the parameter groups and
every hyper-parameter: lr, betas, weight decay, ...) and changes only the implementation flag.
It happens before the first step, when the optimizer has no state to carry over.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from trainers.config import OptimizerChoice
from trainers.errors import ConfigError


def prepare_optimizer(
    optimizer: torch.optim.Optimizer, choice: OptimizerChoice, *, capturable: bool
) -> torch.optim.Optimizer:
    """`optimizer` (as its workload built it, with `capturable`) turned into what `choice` asks.

    Raises ConfigError naming the optimizer class when it cannot be rebuilt as asked.
    """
    if choice == "as-built":
        return optimizer
    if choice == "foreach":
        # fused=False: an optimizer built fused cannot also be foreach (torch refuses both).
        return rebuild(
            optimizer, {"foreach": True, "fused": False}, choice=choice, capturable=capturable
        )
    if choice == "fused":
        return rebuild(
            optimizer, {"fused": True, "foreach": False}, choice=choice, capturable=capturable
        )
    return compile_step(optimizer)


def rebuild(
    optimizer: torch.optim.Optimizer,
    changes: dict[str, Any],
    *,
    choice: str,
    capturable: bool,
) -> torch.optim.Optimizer:
    """A fresh optimizer of the same class over the same parameter groups with `changes` made.

    Keys of `changes` that the constructor does not take are dropped, except the one `choice`
    names (foreach or fused): without it the rebuild would silently be the optimizer as built.
    """
    cls = type(optimizer)
    if optimizer.state:
        raise ConfigError(
            "optimizer",
            choice,
            f"as-built for a {_name(cls)} that has already stepped (a rebuild would lose its "
            "state)",
        )
    accepted = constructor_keywords(cls, optimizer.defaults)
    if choice not in accepted:
        others = [c for c in ("foreach", "fused") if c in accepted]
        allowed = ", ".join(["as-built", *others, "compiled"])
        raise ConfigError(
            "optimizer",
            choice,
            f"{allowed} for {_name(cls)} (its constructor takes no {choice!r} argument)",
        )
    wanted = {key: value for key, value in changes.items() if key in accepted}
    if "capturable" in accepted:
        # Stays what the loop asked for: a CUDA graph needs the step counter on the device.
        wanted["capturable"] = capturable
    defaults = {key: value for key, value in optimizer.defaults.items() if key in accepted}
    # Each group carries its own copy of every hyper-parameter, which wins over the defaults:
    # the change goes into the groups too.
    groups = [{**group, **wanted} for group in optimizer.param_groups]
    try:
        return cls(groups, **{**defaults, **wanted})
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ConfigError(
            "optimizer",
            choice,
            f"a setting {_name(cls)} can be rebuilt with (torch said: {exc})",
        ) from exc


def with_capturable(optimizer: torch.optim.Optimizer, capturable: bool) -> torch.optim.Optimizer:
    """`optimizer` as it is, or rebuilt with `capturable` where its constructor takes the flag and
    its groups say otherwise (a user's optimizer under a CUDA graph). Same state rule as
    `rebuild`: only before its first step."""
    accepted = constructor_keywords(type(optimizer), optimizer.defaults)
    if "capturable" not in accepted or all(
        group.get("capturable", False) == capturable for group in optimizer.param_groups
    ):
        return optimizer
    if optimizer.state:
        raise ConfigError(
            "optimizer",
            _name(type(optimizer)),
            "an optimizer that has not stepped yet (it is rebuilt capturable for a CUDA graph)",
        )
    groups = [
        {
            **{k: v for k, v in group.items() if k == "params" or k in accepted},
            "capturable": capturable,
        }
        for group in optimizer.param_groups
    ]
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    try:
        return type(optimizer)(groups, **{**defaults, "capturable": capturable})
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ConfigError(
            "optimizer",
            _name(type(optimizer)),
            f"an optimizer that can be rebuilt with capturable={capturable} (torch said: {exc})",
        ) from exc


def compile_step(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """`optimizer` with its `step` replaced by `torch.compile(step)` (Inductor's default mode).

    The instance attribute shadows the class's method, so `optimizer.step()` and
    `GradScaler.step(optimizer)` both reach the compiled one. torch.optim graph-breaks on purpose
    around the update (`_use_grad_for_differentiable`), so such a run reports graph breaks.
    On CUDA, Dynamo makes the traced optimizer capturable itself (step counters on the device).
    """
    optimizer.step = torch.compile(optimizer.step)  # type: ignore[method-assign,assignment]
    return optimizer


def constructor_keywords(cls: type[torch.optim.Optimizer], defaults: dict[str, Any]) -> set[str]:
    """The keyword arguments `cls(...)` takes; for a `**kwargs` constructor, its defaults' keys
    (torch's own optimizers put every constructor argument in `defaults`)."""
    parameters = inspect.signature(cls.__init__).parameters.values()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return set(defaults)
    return {p.name for p in parameters if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
