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
without the head. Refused in one line on a device other than CUDA, and at the run's start where
the run is not float8 (no linear converted) or the head cannot be converted.
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


def _convert_head(value: Value, model: nn.Module) -> Undo:
    if value != "float8":
        return nothing
    if not any(float8.is_float8(m) for m in model.modules()):
        raise ConfigError(
            "float8_head", value, "bf16 unless the run's precision is float8 (nothing converted)"
        )
    heads = sorted(float8.output_heads(model))
    kept = {n: float8.keep_reason(model.get_submodule(n), n, set()) for n in heads}
    convertible = tuple(n for n in heads if kept[n] is None)
    if not convertible:
        why = "; ".join(f"{n}: {r}" for n, r in kept.items()) or "no output head found"
        raise ConfigError("float8_head", value, f"bf16 for this model's head ({why})")
    return float8.convert(model, float8.Float8Plan(converted=convertible, kept=()))


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
    transform=_convert_head,
    offered=(),
)
register(FLOAT8_HEAD)
