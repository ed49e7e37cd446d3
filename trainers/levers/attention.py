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
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager

from torch.nn.attention import SDPBackend, sdpa_kernel

from trainers.levers.declare import Lever, Value, ranked, register

_BACKENDS = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}


def _refuse_on(value: Value, device: str) -> str | None:
    if value in _BACKENDS and device != "cuda":
        return f"attention={value!r} is a CUDA kernel, and this run is on {device}"
    return None


def _around_forward(value: Value) -> AbstractContextManager[object]:
    backend = _BACKENDS.get(str(value))
    return contextlib.nullcontext() if backend is None else sdpa_kernel(backend)


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
    offered=(),
)
register(ATTENTION)
