"""`float8_head`: whether a float8 run converts the output head too: `bf16` (the default: kept in
bf16, as torchao's and torchtitan's float8 recipes keep it) or `float8` (converted like the
other linears, tensorwise).

The head is often the largest single matmul of a decoder's step: at a vocabulary of 151,936 and
hidden 896 it holds 136M of a 0.5B model's parameters, and with each layer compiled its matmul
and the loss after it were about 30 ms of the step on an H100 (the loss lever's module doc has the
figures). The recipes keep it in bf16 because its logits feed the loss; whether converting it
still passes the gate, and what it gives, depends on the model: hence a lever, judged by
equivalence. Measured on one H200 (docs/benchmarks/README.md, 2026-11-30), float8 with the
whole model compiled, interleaved with the same step with the head in bf16 (the `float8 +
compile` peer): 1.047x (1.037-1.055) on the Qwen2-style decoder, 1.019x (1.014-1.028) at
`llama-1b` (vocabulary 32,000), and the gate passed it on the Qwen2-style one (a deviation 0.09
of its bound). So the built-in spaces offer it (`offered`): the second stage tries it on a
float8 leader, where its probe predicts it gains more than the tie margin.

Its probe (`Lever.probe`) times the head's matmul, forward and backward, compiled on its own, in
bf16 and on a float8 copy, on the input one forward gives the head: the work the value changes
(the loss after it is the loss lever's). Where float8 cannot run it says why, which leaves the
value out. A search draws it like any searched setting too; drawn beside a precision other
than float8, the trial is refused in one line and runs nothing.

Its effect (`Lever.transform`) runs after the run's float8 conversion (`trainers.float8`): it
converts the head linears `trainers.float8.output_heads` names, where their features are
multiples of 16, and puts the originals back when the run ends (they share their Parameters, so
a tied embedding stays tied). The run's float8 report counts the head with the converted linears
(`trainers.float8.Float8Report.after_levers`). Refused in one line on a device other than CUDA, in
a precision other than float8 (`refuse_in`: before a search enqueues it), and at the run's start
where no linear was converted or the head cannot be.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from trainers import float8
from trainers.errors import ConfigError
from trainers.kept_code import compile_apart
from trainers.levers.declare import Lever, ProbeInput, Undo, Value, nothing, ranked, register
from trainers.levers.timing import graphed, timed_ms


def _refuse_on(value: Value, device: str) -> str | None:
    if value == "float8" and device != "cuda":
        return f"float8_head='float8' converts the head to float8 matmuls, which {device} lacks"
    return None


def _refuse_in(value: Value, precision: str) -> str | None:
    if value == "float8" and precision != "float8":
        return f"bf16 unless the run's precision is float8 (this run's is {precision})"
    return None


def _convert_head(value: Value, model: nn.Module) -> Undo:
    if value != "float8":
        return nothing
    if not any(float8.is_float8(m) for m in model.modules()):
        raise ConfigError(
            "float8_head", value, "bf16 unless the run's precision is float8 (nothing converted)"
        )
    refused = _refuse_for(value, model)
    if refused is not None:
        raise ConfigError("float8_head", value, refused)
    convertible = tuple(n for n, why in _heads(model).items() if why is None)
    return float8.convert(model, float8.Float8Plan(converted=convertible, kept=()))


def _heads(model: nn.Module) -> dict[str, str | None]:
    """The model's output heads, each with why float8 cannot take it (None: it can)."""
    heads = sorted(float8.output_heads(model))
    return {n: float8.keep_reason(model.get_submodule(n), n, set()) for n in heads}


def _refuse_for(value: Value, model: nn.Module) -> str | None:
    if value != "float8":
        return None
    kept = _heads(model)
    if any(why is None for why in kept.values()):
        return None
    why = "; ".join(f"{n}: {r}" for n, r in kept.items()) or "no output head found"
    return f"bf16 for this model's head ({why})"


def _probe(where: ProbeInput) -> dict[Value, float | str]:
    """The head's matmuls a step, forward and backward, each value compiled on its own (as the
    whole model compiled fuses float8's casts: beside each layer compiled the head runs eager,
    so there this is the most the value can give, and the trial says the rest), on what one
    forward passes each head call (a leaf that needs a gradient, as the hidden states do in
    training), summed over the calls; empty where the model has no head float8 can take. Each
    value runs on copies: the model is left as it was."""
    names = [n for n, why in _heads(where.model).items() if why is None]
    if not names:
        return {}
    calls: list[tuple[str, torch.Tensor]] = []
    hooks = [
        where.model.get_submodule(n).register_forward_pre_hook(
            lambda _module, args, name=n: calls.append((name, args[0].detach()))
        )
        for n in names
    ]
    try:
        where.forward()
    finally:
        for hook in hooks:
            hook.remove()
    if not calls:
        return {}
    unavailable = float8.unavailable(where.device)
    figures: dict[Value, float | str] = {}
    for value in ("bf16", "float8"):
        if value == "float8" and unavailable:
            figures[value] = unavailable
            continue
        try:
            figures[value] = _calls_ms(where, calls, value)
        except torch.cuda.OutOfMemoryError:
            continue  # no figure, and no evidence that the value cannot run in a step
        except RuntimeError as exc:  # the compile failed, or no kernel for these shapes
            figures[value] = (str(exc).splitlines() or [type(exc).__name__])[0][:300]
    return figures


def _calls_ms(where: ProbeInput, calls: list[tuple[str, torch.Tensor]], value: Value) -> float:
    """The milliseconds of every recorded call, each on a copy of its own head in `value`."""
    copies = {name: _copy(where.model.get_submodule(name), value) for name, _ in calls}
    return sum(_head_ms(where, copies[name], inputs) for name, inputs in calls)


def _copy(head: nn.Module, value: Value) -> nn.Module:
    """A copy of `head` (its weight copied: the model's stays untouched), in float8 for
    `float8`, held in a container so that the conversion can swap it by name."""
    holder = nn.Sequential(copy.deepcopy(head))
    if value == "float8":
        float8.convert(holder, float8.Float8Plan(converted=("0",), kept=()))
    return holder


def _head_ms(where: ProbeInput, head: nn.Module, recorded: torch.Tensor) -> float:
    # Static shapes, as the run compiles the step at its one batch shape; on a code object of its
    # own, so the trials' code kept in this process stays kept (`compile_apart`).
    compiled = compile_apart(head)
    inputs = recorded.clone().requires_grad_(True)
    grad: list[torch.Tensor] = []

    def step() -> None:
        with where.autocast():  # as the forward calls it: under the run's autocast
            logits = compiled(inputs)
        if not grad:  # the logits' gradient, made once: its own kernels are not the head's
            grad.append(torch.randn_like(logits))
        logits.backward(grad[0])
        inputs.grad = None
        for parameter in head.parameters():
            parameter.grad = None

    # Captured in a CUDA graph, as `float8_linears`' probe: float8 launches more kernels than
    # bf16 (casts, scales), and timed as launched the host's time for them would count.
    return timed_ms(graphed(step, where.device), where.device, warmup=3, iters=10)


FLOAT8_HEAD = Lever(
    name="float8_head",
    label="the output head in a float8 run: kept in bf16 (the recipes' choice) or converted",
    kind="str",
    default="bf16",
    added=6,
    options=ranked(
        ("bf16", "none", "exact", 0),
        ("float8", "none", "equivalence", 1),
    ),
    refuse_on=_refuse_on,
    refuse_in=_refuse_in,
    refuse_for=_refuse_for,
    transform=_convert_head,
    probe=_probe,
    offered=("bf16", "float8"),
    unconverted="bf16",
)
register(FLOAT8_HEAD)
