"""`attention`: which scaled-dot-product-attention kernel the forward runs (`default`: the one
PyTorch's own selection picks; `cudnn` or `flash`: that backend forced around the forward).

Every recipe leaves this at PyTorch's choice, and which backend is fastest depends on the GPU,
the cuDNN build and the head shape. Measured on one H100 80GB HBM3 (torch 2.11.0+cu130, cuDNN
9.19, bf16, 8 x 2048 tokens, causal, forward and backward, CUDA events): 32 heads x 64, flash
2.52 ms against cuDNN 1.66 ms; 16 heads x 128, 2.27 against 1.35 ms. PyTorch's selection prefers
cuDNN on Hopper from cuDNN 9.15 on, so there `default` may already be `cudnn`, and `flash` is the
alternative worth a trial; elsewhere it is the other way round.

A forced backend runs other arithmetic than the reference's (the default backend): the gate
judges it by equivalence. The backward runs the backward of the kernel the forward chose, so a
context around the forward sets both; under `torch.compile` the kernel is chosen while the
graph is traced, inside the same context. A backend the GPU or the shape cannot run (flash and
cuDNN attention need compute capability 8.0 or later; cuDNN's needs cuDNN 9) makes SDPA raise
"No available kernel", and the trial fails with that reason.

Not searched by the built-in spaces yet (`offered` is empty): `--fix attention=cudnn` (or the
API's `fix`) runs it. Whether a search should try it, and on which models, waits for a GPU
measurement of whole steps (the table above is one operation).

A kernel choice can be settled in seconds at the model's own shapes: `attention_calls` records
the SDPA calls of one forward (shapes, dtype, causal, mask), `time_backends` times each value of
the lever forward and backward on them (`benchmarks/attention.py` runs both per model). The
lever's `probe` is the two together: a search's second stage stages a backend only where it is
predicted to gain more than the tie margin of the step, and of those the best predicted alone.
On one H200 (2026-11-28) PyTorch's own choice was cuDNN at every call of `llama-1b` (25.43 ms a step
against 25.46 forced), so there the probe leaves the lever out; on a stack that defaults to flash it
was worth 13 ms of 180. Again on 2026-11-29 (H200, cuDNN 9.19): `llama-1b` default 25.67, cuDNN
25.95, flash 38.54 ms a step; a Qwen2-style decoder (14 heads x 64) 18.18, 18.45 and 26.91 ms.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from trainers.levers.declare import Lever, ProbeInput, Value, ranked, register
from trainers.levers.timing import timed_ms

_BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def _refuse_on(value: Value, device: str) -> str | None:
    if value in _BACKENDS and device != "cuda":
        return f"attention={value!r} is a CUDA kernel, and this run is on {device}"
    return None


def _around_forward(value: Value) -> AbstractContextManager[object]:
    backend = _BACKENDS.get(str(value))
    return contextlib.nullcontext() if backend is None else sdpa_kernel(backend)


def _probe(where: ProbeInput) -> dict[Value, float | str]:
    """Each value's attention milliseconds per training step: every SDPA call one forward makes,
    timed forward and backward (`time_backends`), times its count; a value that cannot run one of
    the calls carries that call's reason; one the device had no memory to time is left out (no
    prediction). Empty: the model calls no SDPA."""
    calls = attention_calls(where.forward)
    per_step: dict[Value, float | str] = {}
    timed = [time_backends(call, where.device) for call in calls]
    for value in ATTENTION.values() if calls else ():
        costs = [t[str(value)] for t in timed]
        failed = [c for c in costs if isinstance(c, str)]
        ran = [(c, n.calls) for c, n in zip(costs, calls, strict=True) if isinstance(c, float)]
        if failed:
            per_step[value] = failed[0]
        elif len(ran) == len(calls):
            per_step[value] = sum(ms * count for ms, count in ran)
    return per_step


ATTENTION = Lever(
    name="attention",
    label="the scaled-dot-product-attention kernel: PyTorch's choice, or cuDNN's or flash forced",
    kind="str",
    default="default",
    added=4,
    options=ranked(
        ("default", "none", "exact", 0),
        ("cudnn", "none", "equivalence", 0),
        ("flash", "none", "equivalence", 0),
    ),
    refuse_on=_refuse_on,
    around_forward=_around_forward,
    probe=_probe,
    offered=(),
)
register(ATTENTION)


@dataclasses.dataclass(frozen=True, slots=True)
class AttentionCall:
    """One kind of SDPA call a forward makes, and how many times (`calls`) per forward."""

    query: tuple[int, ...]
    key: tuple[int, ...]
    value: tuple[int, ...]
    dtype: str
    is_causal: bool
    mask: tuple[int, ...] | None
    """The attention mask's shape (None: no mask)."""
    enable_gqa: bool
    calls: int = 1


def _recording(seen: collections.Counter[AttentionCall]) -> Callable[..., Any]:
    sdpa = F.scaled_dot_product_attention

    def record(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *args: Any, **kw: Any) -> Any:
        mask = args[0] if args else kw.get("attn_mask")
        causal = args[2] if len(args) > 2 else kw.get("is_causal", False)
        out = sdpa(q, k, v, *args, **kw)
        call = AttentionCall(
            query=tuple(q.shape),
            key=tuple(k.shape),
            value=tuple(v.shape),
            # The output's dtype, not the inputs': under autocast a model may pass float32
            # (Hugging Face's Llama after its rotary embedding) and the kernel runs in bf16. On
            # 4 H200s (2026-11-28) the inputs' float32, replayed without autocast, found only
            # the math kernel (37 ms a call) and no cuDNN or flash kernel at all.
            dtype=str(out.dtype).removeprefix("torch."),
            is_causal=bool(causal),
            mask=None if mask is None else tuple(mask.shape),
            enable_gqa=bool(kw.get("enable_gqa", False)),
        )
        seen[call] += 1
        return out

    return record


def attention_calls(forward: Callable[[], object]) -> list[AttentionCall]:
    """The SDPA calls `forward()` makes (run it under the precision it trains in), by kind, the
    most frequent first. Empty: the model calls no `scaled_dot_product_attention` (its own
    attention, or another kernel), and the lever can change nothing in it."""
    seen: collections.Counter[AttentionCall] = collections.Counter()
    # The module attribute is what callers look up at call time (Hugging Face's and timm's
    # attention, and `F.multi_head_attention_forward` through the module's globals). Not a
    # TorchFunctionMode: it sees only the outermost overridable call (`multi_head_attention_
    # forward`), not the SDPA inside it. With gradients on, as in training: without them some
    # modules take a fused path that calls no SDPA.
    original = F.scaled_dot_product_attention
    F.scaled_dot_product_attention = _recording(seen)
    try:
        forward()
    finally:
        F.scaled_dot_product_attention = original
    return [dataclasses.replace(call, calls=count) for call, count in seen.most_common()]


def time_backends(
    call: AttentionCall,
    device: torch.device,
    *,
    warmup: int = 3,
    iters: int = 10,
    values: tuple[Value, ...] | None = None,
) -> dict[str, float | str | None]:
    """Milliseconds of one forward and backward of `call` for each value of the lever (`values`:
    those only), on `device` (CUDA events), or why that value cannot run it (a CPU, "No
    available kernel"); None where the device ran out of memory (no figure, and no evidence
    that the value cannot run in a training step)."""
    dtype = getattr(torch, call.dtype)
    made = torch.Generator(device=device).manual_seed(0)

    def tensor(shape: tuple[int, ...]) -> torch.Tensor:
        return torch.randn(shape, generator=made, device=device, dtype=dtype, requires_grad=True)

    q, k, v = tensor(call.query), tensor(call.key), tensor(call.value)
    mask = None
    if call.mask is not None:
        # A causal pattern broadcast to the recorded shape: which positions are masked changes
        # the work little; whether a mask is there at all decides which kernels can run.
        rows, cols = call.mask[-2], call.mask[-1]
        mask = torch.ones(rows, cols, device=device, dtype=torch.bool).tril().expand(call.mask)
    out: dict[str, float | str | None] = {}
    for value in ATTENTION.values() if values is None else values:
        reason = _refuse_on(value, device.type)
        if reason is not None:
            out[str(value)] = reason
            continue
        try:
            with _around_forward(value):
                step = functools.partial(_step, q, k, v, mask, call)
                out[str(value)] = timed_ms(step, device, warmup, iters)
        except torch.cuda.OutOfMemoryError:
            out[str(value)] = None
        except RuntimeError as exc:  # no kernel of that backend for these shapes
            out[str(value)] = str(exc).splitlines()[0][:300]
    return out


def _step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    call: AttentionCall,
) -> None:
    y = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=call.is_causal, enable_gqa=call.enable_gqa
    )
    y.sum().backward()
