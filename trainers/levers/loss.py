"""`loss`: how the model's loss is computed: `model` (as the model computes it, the default) or
`compiled` (the model's own loss function compiled on its own, with torch.compile).

Compiling each decoder block on its own (`compile_scope='blocks'`), the fastest loop on some
models, leaves what lies between the blocks eager: the head and the loss. The cross-entropy over a
large vocabulary upcasts the logits to float32 and, eager, stores them, their log-softmax and
their gradient; compiled, Inductor fuses the upcast, the log-softmax and the loss into a few
kernels that never store the float32 logits. Measured on one H100 80GB HBM3 (torch 2.11.0+cu130,
bf16, 8 x 2048 tokens, forward and backward, CUDA events), the head and the cross-entropy
together: vocabulary 32,000 at hidden 2,048, eager 16.4 ms and +8.1 GiB, compiled 9.5 ms and
+1.3 GiB; vocabulary 151,936 at hidden 896, eager 59.8 ms and +37.4 GiB, compiled 29.6 ms and
+5.2 GiB. Here the head's matmul stays outside the compiled function (one GEMM either way): what
that leaves of the gain on a whole step is not measured yet.

A Hugging Face model computes its loss, given `labels=`, through `model.loss_function`; `compiled`
sets it to the compiled function for the run and puts the original back after. A model without
one (a user's own model, a torchvision or timm model: their loss is the workload's) is refused in
one line, and a search leaves it out of such a model's space. With the whole model compiled
(`compile` other than `none`, `compile_scope='model'`) the loss is already inside the compiled
graph: set by hand, refused, naming what to set instead; drawn by a search, inert (`inert`:
`trainers.canonical` runs that config at `model`, unless it was pinned).

The compiled loss rounds otherwise than the eager one: the gate judges it by equivalence.
Searched by the built-in space that compiles each layer (`scale`; `offered`: a value that costs
a compile stays out of the spaces that do not search `compile_scope`, where it would mostly run
as the whole model compiled), and reached by a search's second stage on a leader that compiles
each layer. Its probe (`Lever.probe`) times the model's own loss function, forward and backward,
eager and compiled, on the arguments one forward passes it: seconds, where a trial compiles the
model. Measured on one H200 (float8, each layer compiled, the scale space's feed, 2026-11-29,
docs/benchmarks/levers-h200-2026-11-29.md), the probe and the whole step agree: at `llama-1b`
(vocabulary 32,000) the probe predicted 5.1 ms a step and the whole step ran 1.026x
(1.016-1.031) faster with it; at a Qwen2-style 0.49B decoder (vocabulary 151,936, hidden 896)
25.8 ms predicted and 1.188x (1.171-1.206) measured, 5.6 GB lighter than the fastest peer. On
both the config then ran as fast as the whole model compiled in float8 (1.00x and 1.01x that
peer), which the search already finds: the lever pays where each layer compiled leads. What it
gives a default job is not measured on a GPU yet.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from trainers.errors import ConfigError
from trainers.kept_code import compile_apart
from trainers.levers.declare import Lever, ProbeInput, Undo, Value, nothing, ranked, register
from trainers.levers.timing import timed_ms


def _inert(get: Callable[[str], Value]) -> bool:
    """The whole model compiled: its compile already takes in the loss."""
    return get("compile") != "none" and get("compile_scope") == "model"


def _conflicts(value: Value, get: Callable[[str], Value]) -> str | None:
    if value == "compiled" and _inert(get):
        return (
            "model with the whole model compiled (its compile already takes in the loss); "
            "loss='compiled' goes with compile_scope='blocks' or compile='none'"
        )
    return None


def _refuse_for(value: Value, model: nn.Module) -> str | None:
    if value == "compiled" and not callable(getattr(model, "loss_function", None)):
        return (
            f"model for {type(model).__name__}, which computes no loss of its own through a "
            "`loss_function` (a Hugging Face model given labels= does)"
        )
    return None


def _compile_loss(value: Value, model: nn.Module) -> Undo:
    if value != "compiled":
        return nothing
    refused = _refuse_for(value, model)
    if refused is not None:
        raise ConfigError("loss", value, refused)
    original: Any = model.loss_function
    before = set(vars(model))
    try:
        # transformers' `loss_function` is a property with a setter: set for this run only
        # (through setattr: nn.Module's __setattr__ is typed for tensors and modules).
        setattr(model, "loss_function", torch.compile(original))  # noqa: B010
    except AttributeError as exc:
        raise ConfigError(
            "loss", value, f"model for {type(model).__name__}, whose loss_function cannot be set"
        ) from exc

    def undo() -> None:
        _put_back(model, original, before)

    return undo


def _put_back(model: nn.Module, original: Any, before: set[str]) -> None:
    """`model.loss_function` back to `original`, and the model's `__dict__` back to the keys it
    had (`before`) where the setter added one for it: transformers' setter stores the function
    as `_loss_function`, and its getter asks `hasattr` for it, which Dynamo guards. A model left
    holding it fails the guards of whole-model code compiled on a fresh model (and a fresh model
    fails its code's), which then compiles again: the gate's and the final round's runs are made
    on fresh models. Only keys that hold `original` now go: what the run itself added stays."""
    setattr(model, "loss_function", original)  # noqa: B010
    for added in set(vars(model)) - before:
        if vars(model)[added] is original:
            delattr(model, added)


def _probe(where: ProbeInput) -> dict[Value, float | str]:
    """The loss function's milliseconds a step, forward and backward, as the model calls it and
    compiled, on the arguments one forward passes it (the logits a leaf that needs a gradient,
    as in training); empty where the model has no loss function of its own or does not call it.
    The compiled value's first calls compile (seconds, on one function, not the model)."""
    model = where.model
    original: Any = getattr(model, "loss_function", None)
    if not callable(original):
        return {}
    seen: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def record(*args: Any, **kwargs: Any) -> Any:
        seen.append((args, kwargs))
        return original(*args, **kwargs)

    before = set(vars(model))
    setattr(model, "loss_function", record)  # noqa: B010 - for the one forward, as the lever does
    try:
        where.forward()
    finally:
        _put_back(model, original, before)
    if not seen:
        return {}
    calls, (args, kwargs) = len(seen), (_leaves(a) for a in seen[0])
    # The recorded arguments hold the forward's graph (the logits' grad_fn, every activation it
    # saved): dropped before the timing, which needs only the detached copies.
    seen.clear()
    figures: dict[Value, float | str] = {}
    # The compiled value on a code object of its own (`compile_apart`): the model's loss function
    # is what a run with loss="compiled" compiles too, and the trials' code stays kept.
    for value, function in (("model", original), ("compiled", compile_apart(original))):

        def step(function: Any = function) -> None:
            with where.autocast():  # as the forward calls it: under the run's autocast
                loss = function(*args, **kwargs)
            loss.backward()

        try:
            figures[value] = timed_ms(step, where.device, warmup=3, iters=10) * calls
        except torch.cuda.OutOfMemoryError:
            continue  # no figure, and no evidence that the value cannot run in a step
        except RuntimeError as exc:  # the compile failed, or no kernel for these shapes
            figures[value] = str(exc).splitlines()[0][:300]
    return figures


def _leaves(found: Any) -> Any:
    """`found` (a call's args or kwargs) with each tensor a detached copy; a floating one needs
    a gradient where it did (the logits)."""
    if isinstance(found, dict):
        return {k: _leaves(v) for k, v in found.items()}
    if isinstance(found, tuple | list):
        return type(found)(_leaves(v) for v in found)
    if isinstance(found, torch.Tensor):
        return found.detach().clone().requires_grad_(found.requires_grad)
    return found


LOSS = Lever(
    name="loss",
    label="the loss: as the model computes it, or its loss function compiled on its own",
    kind="str",
    default="model",
    added=5,
    options=ranked(
        ("model", "none", "exact", 0),
        ("compiled", "compile", "equivalence", 1),
    ),
    refuse_for=_refuse_for,
    transform=_compile_loss,
    probe=_probe,
    conflicts=_conflicts,
    inert=_inert,
    offered=("model", "compiled"),
)
register(LOSS)
