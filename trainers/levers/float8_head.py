"""`float8_head`: whether a float8 run converts the output head too: `bf16` (the default: kept in
bf16, as torchao's and torchtitan's float8 recipes keep it) or `float8` (converted like the
other linears, tensorwise).

The head is often the largest single matmul of a decoder's step: at a vocabulary of 151,936 and
hidden 896 it holds 136M of a 0.5B model's parameters, and with each layer compiled its matmul
and the loss after it were about 30 ms of the step on an H100 (the loss lever's module doc has the
figures). The recipes keep it in bf16 because its logits feed the loss; whether converting it
still passes the gate, and what it gives, depends on the model: hence a lever, judged by
equivalence, and not searched by the built-in spaces until a GPU measures it (`--fix
float8_head=float8`, or the API's `fix`).

Its effect (`Lever.transform`) runs after the run's float8 conversion (`trainers.float8`): it
converts the head linears `trainers.float8.output_heads` names, where their features are
multiples of 16, and puts the originals back when the run ends (they share their Parameters, so
a tied embedding stays tied). The run's float8 report counts the linears the precision converted,
without the head. Refused in one line on a device other than CUDA, in a precision other than float8
(`refuse_in`: before a search enqueues it), and at the run's start where no linear was converted
or the head cannot be.
"""

from __future__ import annotations

from torch import nn

from trainers import float8
from trainers.errors import ConfigError
from trainers.levers.declare import Lever, Undo, Value, nothing, ranked, register


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
    offered=(),
)
register(FLOAT8_HEAD)
