"""Model FLOP utilisation: the model's FLOPs per training step against the GPU's dense peak.

FLOPs are counted, not estimated: one forward and backward of the eager model under
`torch.utils.flop_counter.FlopCounterMode`, which counts matmuls, convolutions and attention
(forward and backward formulas per op). The count runs on a one-sample slice of a batch and is
scaled by the samples per batch: every op it counts is linear in the batch, and a one-sample
step never runs out of memory where the whole step would. It runs on the plain model, before
any recomputation lever wraps it, so recomputed FLOPs are never counted as model FLOPs (MFU, not
hardware FLOP utilisation). Elementwise ops, normalisations and the optimizer are not counted,
as in the usual 6 x parameters x tokens figure.

The peak is the GPU's dense (no 2:4 sparsity) tensor-core rate for the run's precision, from
`PEAKS` below (vendor data sheets, boost clock). A GPU not in the table gets no MFU, and
`mfu_note` says why; so does a CPU run.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from trainers.float8 import linear_dims
from trainers.meta import meta_copy
from trainers.workloads.base import Batch, Workload, item_as_loaded


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Peak:
    """Dense TFLOP/s of one GPU model: bf16/fp16 tensor cores, TF32 tensor cores, plain fp32."""

    name: str
    pattern: str
    """A regular expression searched in `torch.cuda.get_device_name()`."""
    bf16: float
    tf32: float
    fp32: float


# Order matters: the first pattern that matches names the GPU (an H100 NVL also says "H100").
PEAKS: tuple[Peak, ...] = (
    Peak(name="H200 NVL", pattern=r"H200 NVL", bf16=835.0, tf32=417.5, fp32=60.0),
    Peak(name="H200 SXM", pattern=r"H200", bf16=989.4, tf32=494.7, fp32=66.9),
    Peak(name="H100 NVL", pattern=r"H100 NVL", bf16=835.0, tf32=417.5, fp32=60.0),
    Peak(name="H100 PCIe", pattern=r"H100 PCIe", bf16=756.0, tf32=378.0, fp32=51.2),
    # "NVIDIA H100 80GB HBM3" is the SXM part's name.
    Peak(name="H100 SXM", pattern=r"H100", bf16=989.4, tf32=494.7, fp32=66.9),
    Peak(name="A100", pattern=r"A100", bf16=312.0, tf32=156.0, fp32=19.5),
    Peak(name="L4", pattern=r"\bL4\b", bf16=121.0, tf32=60.0, fp32=30.3),
)


def peak_for(gpu_name: str | None) -> Peak | None:
    if not gpu_name:
        return None
    for peak in PEAKS:
        if re.search(peak.pattern, gpu_name):
            return peak
    return None


def peak_column(precision: str | None, matmul_precision: str) -> str:
    """Which of a Peak's rates a run's matmuls run at. Reduced-precision autocast (and float8,
    whose MFU is quoted against the bf16 rate: the model's FLOPs do not change) -> bf16;
    float32 tensors -> TF32 unless the matmul precision is 'highest'."""
    if precision is not None and precision not in ("fp32", "tf32"):
        return "bf16"
    if precision == "tf32" or (precision is None and matmul_precision != "highest"):
        return "tf32"
    return "fp32"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Utilisation:
    tflops: float | None
    """Achieved model TFLOP/s (None without a FLOP count)."""
    mfu: float | None
    """tflops / the GPU's dense peak for the run's precision, 0..1 (None: see note)."""
    peak_tflops: float | None
    note: str | None
    recompute_share: float | None = None
    """FLOPs the step computes again for activation checkpointing, as a share of the model's
    (`count_recompute_flops`): compute the step does beyond what MFU counts. None: not counted."""


def utilisation(
    flops_per_step: int | None,
    step_ms: float,
    *,
    gpu_name: str | None,
    precision: str | None,
    matmul_precision: str,
) -> Utilisation:
    if flops_per_step is None or flops_per_step <= 0 or step_ms <= 0:
        return Utilisation(tflops=None, mfu=None, peak_tflops=None, note="no FLOP count")
    tflops = flops_per_step / (step_ms / 1e3) / 1e12
    if gpu_name is None:
        return Utilisation(
            tflops=tflops, mfu=None, peak_tflops=None, note="CPU run: MFU is quoted for GPUs only"
        )
    peak = peak_for(gpu_name)
    if peak is None:
        known = ", ".join(p.name for p in PEAKS)
        return Utilisation(
            tflops=tflops,
            mfu=None,
            peak_tflops=None,
            note=f"no dense peak known for {gpu_name!r} (trainers/flops.py knows {known})",
        )
    column = peak_column(precision, matmul_precision)
    rate = float(getattr(peak, column))
    note = f"against the {peak.name} dense {column} peak, {rate:g} TFLOP/s"
    if precision == "float8":
        # The model's FLOPs do not change with the precision that runs them: a float8 run is
        # quoted against the bf16 rate (as torchtitan does), never the float8 one, so its MFU
        # compares with a bf16 run's and shows what float8 bought.
        note = "float8 matmuls, MFU " + note
    return Utilisation(tflops=tflops, mfu=tflops / rate, peak_tflops=rate, note=note)


_COUNTS: dict[tuple[Any, ...], dict[str, int]] = {}


def _one_sample(batch: Batch, samples: int) -> tuple[Batch, int]:
    """The batch's first sample (dim 0) and the factor that scales its count back up; the whole
    batch and 1 when a tensor's first dimension is not the batch."""
    if samples > 1 and all(t.dim() > 0 and t.shape[0] == samples for t in batch):
        return tuple(t[:1] for t in batch), samples
    return batch, 1


def first_batch(workload: Workload) -> Batch:
    """The workload's first batch as its loader would make it (one item, or `batch_size` items
    collated), without a loader."""
    if workload.batch_size is None:
        return tuple(item_as_loaded(workload, workload.dataset[0]))
    samples = [workload.dataset[i] for i in range(workload.batch_size)]
    if workload.collate_fn is not None:
        return tuple(workload.collate_fn(samples))
    collated = torch.utils.data.default_collate(samples)
    return tuple(collated)


def _shape_key(batch: Iterable[torch.Tensor]) -> tuple[Any, ...]:
    return tuple((tuple(t.shape), str(t.dtype)) for t in batch)


def _model_key(workload: Workload) -> tuple[Any, ...]:
    """What else the count depends on: the model's class, its parameters' names and shapes, its
    attention implementation and the loss function. A library model's options are not in its
    workload's name or preset: without this, `hf:causal-lm` tiny with arch=qwen2 was given the
    count made for arch=llama (or sdpa's for eager) when both ran in one process."""
    model = workload.model
    config = getattr(model, "config", None)
    parameters = tuple(
        (name, tuple(p.shape), p.requires_grad) for name, p in model.named_parameters()
    )
    return (
        type(model).__qualname__,
        getattr(config, "_attn_implementation", None),
        getattr(workload.loss_fn, "__qualname__", None),
        parameters,
    )


def count_step_flops(workload: Workload, device: torch.device) -> int:
    """FLOPs of one training step of `workload` (forward + backward), counted once per process
    for each workload, preset and batch shape.

    Leaves the model as it found it: eval mode during the count (so BatchNorm's running
    statistics do not move and dropout draws no random numbers), the random-number state forked,
    the gradients it made dropped.
    """
    return count_step_flops_by_linear(workload, device)[""]


def count_step_flops_by_linear(workload: Workload, device: torch.device) -> dict[str, int]:
    """`count_step_flops` ("" the whole step) and, for each `nn.Linear` or Hugging Face
    `Conv1D` (`trainers.float8.linear_dims`) by qualified name, the
    FLOPs of its matmuls in that step: 2 x rows x in x out for the output, as much again for the
    weight's gradient (when it is trained) and for the input's (when one is needed). Counted in
    the same pass as the total, once.

    Not FlopCounterMode's own split by module: it books a backward op to every module whose
    backward it believes is running, and on a Hugging Face Llama its per-module sums exceeded
    the step's total (1.15x on the tiny preset).
    """
    batch = first_batch(workload)
    key = (workload.name, workload.preset, _shape_key(batch), _model_key(workload))
    if key not in _COUNTS:
        _COUNTS[key] = _counted(workload, batch, device)
    return _COUNTS[key]


def count_recompute_flops(workload: Workload, config: Any, device: torch.device) -> int:
    """FLOPs a step of `config` computes a second time in its backward (activation
    checkpointing: the checkpointed blocks' forward, or with `selective` only what its policy
    does not keep), counted like `count_step_flops`: the step with the config's checkpointing
    applied, less the model's FLOPs. 0 without checkpointing. MFU leaves them out (they are not
    model FLOPs); their share of the model's is what a checkpointing config pays in compute."""
    if config.activation_checkpointing == "none":
        return 0
    from trainers.recompute import apply_block_levers  # trainers.recompute imports workloads

    batch = first_batch(workload)
    levers = (config.activation_checkpointing, config.checkpoint_share)
    key = (workload.name, workload.preset, _shape_key(batch), _model_key(workload), *levers)
    if key not in _COUNTS:
        # Checkpointing only: a compiled block would be compiled for nothing here.
        undo = apply_block_levers(workload, config.replace(compile="none", compile_scope="model"))
        try:
            _COUNTS[key] = _counted(workload, batch, device)
        finally:
            undo()
    return max(0, _COUNTS[key][""] - count_step_flops(workload, device))


def _counted(workload: Workload, batch: Batch, device: torch.device) -> dict[str, int]:
    """One uncached count (`count_step_flops_by_linear`): on the meta device where the model and
    its loss run there, else where the model is.

    The count reads shapes only. A real one-sample step of a 0.5B decoder at 2,048 tokens
    (vocabulary 151,936) took 38.5 s on this project's 2-core CPU, where a job on the CPU (the
    README's first command, the tests) counts before its first run; on a GPU it is a step there,
    memory included. On a copy of the model whose weights are meta tensors the count took 0.49 s
    against 8.2 s at 256 tokens, equal in total and linear by linear, as on every built-in and
    library workload tried (`tests/trainers/test_flops.py`). A model or loss that reads values
    (`.item()`, a tensor held elsewhere, PyTorch's nested-tensor fast path) fails there, and is
    counted for real."""
    try:
        return _count(workload, meta_copy(workload.model), batch, torch.device("meta"))
    except Exception:  # noqa: BLE001 - what a meta tensor cannot do, the real count does
        return _count(workload, workload.model, batch, device)


def _count(
    workload: Workload, model: nn.Module, batch: Batch, device: torch.device
) -> dict[str, int]:
    """The count of `_counted` on `model` (the workload's, or its meta copy)."""
    piece, factor = _one_sample(batch, workload.samples_per_batch)
    # Counted where the model is: the count does not depend on the device (`benchmarks/peers.py
    # --add-mfu` counts on a CPU), and a model not yet moved to `device` (a comparison that
    # counts before its first run) would otherwise meet its inputs on another device.
    where = next((p.device for p in model.parameters()), device)
    piece = tuple(t.to(where) for t in piece)
    was_training = model.training
    grads = {p: p.grad for p in model.parameters()}
    devices = [where] if where.type == "cuda" else []
    linears: dict[str, int] = {}
    hooks = [
        module.register_forward_hook(_linear_counter(name, dims, linears))
        for name, module in model.named_modules()
        if (dims := linear_dims(module)) is not None
    ]
    try:
        model.eval()
        counting = FlopCounterMode(display=False, custom_mapping=_attention_formulas())
        with torch.random.fork_rng(devices=devices), counting as counter:
            loss = workload.loss_fn(model, piece)
            loss.backward()
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
        for param, grad in grads.items():
            param.grad = grad
    counts = {"": int(counter.get_total_flops()) * factor}
    counts.update({name: flops * factor for name, flops in linears.items()})
    return counts


_ATTENTION_OPS = (
    # (forward, backward) of every fused attention kernel `scaled_dot_product_attention` runs:
    # flash, memory-efficient and cuDNN on a GPU, flash on a CPU. Each takes query, key, value
    # first (its backward the output's gradient, then query, key, value).
    ("_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_backward"),
    (
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_efficient_attention_backward",
    ),
    ("_scaled_dot_product_cudnn_attention", "_scaled_dot_product_cudnn_attention_backward"),
    (
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
    ),
)


def _attention_formulas() -> dict[Any, Any]:
    """One formula for attention's model FLOPs, whatever kernel runs it and whatever torch counts:
    forward, QK^T and AV, 4 x batch x heads x query length x key length x head size (a causal
    mask is not discounted, as in the usual 12 x layers x hidden x sequence per token); backward
    twice that (the gradients of both products).

    torch's own formulas disagree by device and version: it has none for the CPU's kernel (a
    count on a CPU left attention out: 102.1 TFLOP a step for the 1.1B preset, 8 x 2048 tokens,
    against 115.3 on an H100 with torch 2.11; 2026-11-26, commit 3393cc6), and torch 2.13's
    backward adds the scores the flash kernel computes again, which is recomputation, not model
    FLOPs (MFU leaves it out)."""

    def forward(query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> int:
        return _attention_forward(query, key, value)

    def backward(grad: Any, query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> int:
        return 2 * _attention_forward(query, key, value)

    aten = torch.ops.aten
    formulas: dict[Any, Any] = {}
    for forward_name, backward_name in _ATTENTION_OPS:
        for name, formula in ((forward_name, forward), (backward_name, backward)):
            op = getattr(aten, name, None)
            if op is not None:  # an op this torch does not have is never run by it
                formulas[op] = formula
    return formulas


def _attention_forward(query: Any, key: Any, value: Any) -> int:
    """QK^T and AV of (batch, heads, length, head size) shapes: 2 x b x h x Lq x Lk x (d + dv).
    Key and value may have fewer heads (grouped-query attention, `enable_gqa`): every query head
    multiplies, so the query's heads count (torch 2.11's own formula refused such shapes)."""
    b, h, s_q, d = query
    s_k, d_v = key[-2], value[-1]
    return int(2 * b * h * s_q * s_k * (d + d_v))


def _linear_counter(name: str, dims: tuple[int, int], into: dict[str, int]) -> Any:
    features_in, features_out = dims

    def hook(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
        x = args[0] if args else None
        if not isinstance(x, torch.Tensor):
            return
        matmul = 2 * (x.numel() // features_in) * features_in * features_out
        weight = getattr(module, "weight", None)
        trained = isinstance(weight, torch.Tensor) and weight.requires_grad
        passes = 1 + int(trained) + int(x.requires_grad)
        into[name] = into.get(name, 0) + passes * matmul

    return hook


def trainable(model: nn.Module) -> int:
    """Trainable parameters, for the 6 x parameters x tokens cross-check in tests and docs."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
