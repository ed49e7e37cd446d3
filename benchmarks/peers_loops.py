"""The peers of `benchmarks/peers.py`: the training loops users write instead of tuning, each
timed as its users run it (`user_loop`).

Each peer is a plain loop over the workload's model, loss, optimizer and dataset, with a pinned
2-worker DataLoader and `loss.item()` every 10 steps, prepared the way its users prepare it
(`PEERS`: fused optimizer, `torch.compile` of the model or of each decoder layer, Hugging Face
or torchtitan checkpointing, torchao's float8 conversion, gradient accumulation in halves).
"""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, cast

import torch

from trainers import Workload, prepare_optimizer

PEERS: dict[str, dict[str, Any]] = {
    "pytorch-idiom": {"fused": False, "compile": None},
    "fused-optimizer": {"fused": True, "compile": None},
    "compile-default": {"fused": False, "compile": "default"},
    "compile-reduce-overhead": {"fused": False, "compile": "reduce-overhead"},
    # At scale (0.3-8B parameters), as their users write them:
    # `torch.compile(model)` with fused AdamW, the plain strong loop;
    "compile-fused": {"fused": True, "compile": "default"},
    # the Hugging Face way: gradient checkpointing on every layer, `torch.compile`, fused AdamW;
    "hf-checkpointing": {"fused": True, "compile": "default", "checkpointing": "hf"},
    # the torchtitan way: each decoder layer compiled on its own, selective activation
    # checkpointing (matmul and attention outputs kept), fused AdamW;
    "torchtitan": {"fused": True, "compile": "per-layer", "checkpointing": "selective"},
    # gradient accumulation in halves until the step fits, as `auto_find_batch_size` users end up.
    "accumulate-halves": {"fused": True, "compile": "default", "accumulate": "halves"},
    # each decoder layer compiled on its own, nothing recomputed: the fastest bf16 loop of the
    # float8 issue's table (434.7 ms on the 1.1B decoder, 16 x 2048);
    "compile-per-layer": {"fused": True, "compile": "per-layer"},
    # Float8 matmuls (bf16 autocast around them), where the job allows float8:
    # torchao's README: `convert_to_float8_training` (tensorwise, the last linear and any whose
    # features are not multiples of 16 left alone), then `torch.compile(model)`;
    "float8-compile": {"fused": True, "compile": "default", "float8": True},
    # torchtitan's float8: the same conversion, then each decoder layer compiled on its own.
    "float8-per-layer": {"fused": True, "compile": "per-layer", "float8": True},
}
PEER_LABELS = {
    "pytorch-idiom": "PyTorch idiom",
    "fused-optimizer": "fused optimizer",
    "compile-default": "compile",
    "compile-reduce-overhead": "compile reduce-overhead",
    "compile-fused": "compile + fused",
    "hf-checkpointing": "HF checkpointing + compile",
    "torchtitan": "torchtitan (per-layer compile + SAC)",
    "accumulate-halves": "accumulate in halves + compile",
    "compile-per-layer": "per-layer compile",
    "float8-compile": "torchao float8 + compile",
    "float8-per-layer": "float8 + per-layer compile (torchtitan)",
}
SCALE_PEERS = ("compile-fused", "hf-checkpointing", "torchtitan", "accumulate-halves")
FLOAT8_PEERS = ("compile-per-layer", "float8-compile", "float8-per-layer")
"""Added to a preset's peers when its tuning job may choose float8 (`--allow-precisions`): the
strongest bf16 loop of that regime and the two float8 loops users write."""
SMALL_PEERS = ("pytorch-idiom", "fused-optimizer", "compile-default", "compile-reduce-overhead")
READ_EVERY = 10


@dataclasses.dataclass
class Run:
    """One timed run of a loop: its windows' ms/step, its set-up beyond that many steady steps
    (compile included), the losses it read, its peak memory and the micro-batches per step."""

    windows_ms: list[float]
    setup_s: float
    losses: list[float]
    peak_memory_bytes: int | None = None
    micro_batches: int = 1


def _batches(loader: torch.utils.data.DataLoader[Any]) -> Iterator[Any]:
    while True:
        yield from loader


def _layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The decoder layers, found as a user finds them: `model.model.layers` (Llama, Qwen2,
    Mistral), `model.gpt_neox.layers` (GPT-NeoX), `model.transformer.h` (GPT-2),
    `model.bert.encoder.layer` (BERT)."""
    paths = (
        "model.layers",
        "gpt_neox.layers",
        "transformer.h",
        "bert.encoder.layer",
        "layers",
        "blocks",
    )
    for path in paths:
        found: Any = model
        for name in path.split("."):
            found = getattr(found, name, None)
        if isinstance(found, torch.nn.ModuleList):
            return list(found)
    raise ValueError(f"no decoder layers found in {type(model).__name__}")


def _titan_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> Any:
    from torch.utils.checkpoint import CheckpointPolicy

    aten = torch.ops.aten
    saved = (
        aten.mm.default,
        aten._scaled_dot_product_flash_attention.default,
        aten._scaled_dot_product_efficient_attention.default,
        aten._scaled_dot_product_cudnn_attention.default,
    )
    return CheckpointPolicy.MUST_SAVE if op in saved else CheckpointPolicy.PREFER_RECOMPUTE


def _compile_each_layer(model: torch.nn.Module, *, selective: bool) -> Callable[[], None]:
    """Each decoder layer compiled on its own, in place; with `selective`, torchtitan's recipe
    written out: each layer first wrapped in a selective activation checkpoint
    (`ptd_checkpoint_wrapper` with an op policy). Returns what puts the layers back."""
    import functools

    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    layers = _layers(model)
    parent_of = {
        id(m): (parent, name) for parent in model.modules() for name, m in parent.named_children()
    }
    context = functools.partial(create_selective_checkpoint_contexts, _titan_policy)
    placed: list[tuple[torch.nn.Module, str, torch.nn.Module]] = []

    def undo() -> None:
        for parent, name, layer in placed:
            setattr(parent, name, layer)

    try:
        for layer in layers:
            wrapped = (
                checkpoint_wrapper(layer, context_fn=context, preserve_rng_state=False)
                if selective
                else layer
            )
            compiled = torch.compile(wrapped)
            parent, name = parent_of[id(layer)]
            setattr(parent, name, compiled)
            placed.append((parent, name, layer))
    except BaseException:
        undo()  # no layer left compiled behind a failure
        raise
    return undo


def float8_peer_error(device: torch.device, precision: str | None) -> str | None:
    """Why a float8 peer cannot run here (None: it can): float8 tensor cores and torchao, under
    bf16 autocast as torchao's and torchtitan's recipes train."""
    from trainers.float8 import unavailable

    if precision != "bf16-autocast":
        return f"float8 peers train under bf16-autocast (torchao's recipe); this run is {precision}"
    return unavailable(device)


def _to_float8_as_torchao_writes_it(model: torch.nn.Module) -> Callable[[], None]:
    """torchao's README, written out: `convert_to_float8_training` with its default (tensorwise)
    config and its README's filter: not the last linear (the output head), not a linear whose
    features are not multiples of 16. In place; returns what puts the `nn.Linear` modules back
    (torchao's modules share their Parameters, so what was trained stays trained)."""
    from torchao.float8 import convert_to_float8_training

    linears = {
        name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear) and name
    }
    last = list(linears)[-1] if linears else None

    def module_filter_fn(module: torch.nn.Module, fqn: str) -> bool:
        if fqn == last:
            return False
        if isinstance(module, torch.nn.Linear):
            return module.in_features % 16 == 0 and module.out_features % 16 == 0
        return True

    convert_to_float8_training(model, module_filter_fn=module_filter_fn)

    def undo() -> None:
        for name, module in linears.items():
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, module)

    # Only a converted plain nn.Linear runs float8: a subclass such as nn.MultiheadAttention's
    # out_proj is converted too, but its owner reads the weight directly. GPT-2's layers are
    # transformers' Conv1D: nothing qualifies there, and such a loop would be bf16 under a
    # float8 name.
    swapped = [
        name
        for name, module in linears.items()
        if type(module) is torch.nn.Linear and model.get_submodule(name) is not module
    ]
    if not swapped:
        undo()
        raise ValueError(
            "float8: no plain nn.Linear of this model qualifies (only its output head, "
            "subclasses whose owners read the weight, or none at all)"
        )
    return undo


def _prepare_model(
    model: torch.nn.Module, spec: Mapping[str, Any]
) -> tuple[torch.nn.Module, Callable[[], None]]:
    """The model a peer trains, converted, checkpointed and compiled as its users do it (float8
    conversion first, then compilation: torchao's order), and what puts the shared model back as
    it was for the next peer."""
    undos: list[Callable[[], None]] = []

    def undo() -> None:
        for step in reversed(undos):
            step()

    try:
        if spec.get("float8"):
            undos.append(_to_float8_as_torchao_writes_it(model))
        if spec.get("compile") == "per-layer":
            undos.append(
                _compile_each_layer(model, selective=spec.get("checkpointing") == "selective")
            )
            return model, undo
        if spec.get("checkpointing") == "hf":
            enable = getattr(model, "gradient_checkpointing_enable", None)
            disable = getattr(model, "gradient_checkpointing_disable", None)
            if enable is None or disable is None:
                raise ValueError("gradient_checkpointing_enable: not a Hugging Face model")
            enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            undos.append(disable)
    except BaseException:
        undo()  # the shared model as it was, for the next peer
        raise
    compile_mode = spec.get("compile")
    if compile_mode is None:
        return model, undo
    # torch.compile of a module returns an OptimizedModule (typed as a callable).
    return cast(torch.nn.Module, torch.compile(model, mode=compile_mode)), undo


def _fits(step: Callable[[int], None], device: torch.device) -> bool:
    """One step at `micro` micro-batches; False when it ran out of memory."""
    try:
        step(0)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    except torch.cuda.OutOfMemoryError:
        return False
    return True


def user_loop(
    workload: Workload,
    *,
    device: torch.device,
    precision: str | None,
    fused: bool,
    compile_mode: str | None,
    warmup: int,
    windows: int,
    window_steps: int,
    spec: Mapping[str, Any] | None = None,
) -> Run:
    """The loop a user writes, timed: `warmup` steps, then `windows` windows of `window_steps`."""
    cuda = device.type == "cuda"
    spec = dict(spec or {"fused": fused, "compile": compile_mode})
    started = time.perf_counter()
    if compile_mode is not None:
        torch._dynamo.reset()  # a fresh training process: disk caches warm, memory ones empty
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    model = workload.model.to(device)
    model.train()
    optimizer = workload.make_optimizer(model.parameters(), False)
    if fused:
        optimizer = prepare_optimizer(optimizer, "fused", capturable=False)
    forward, undo = _prepare_model(model, spec)
    try:
        return _timed(
            workload,
            forward,
            optimizer,
            spec,
            device,
            precision,
            warmup,
            windows,
            window_steps,
            started,
        )
    finally:
        undo()


class _UserStep:
    """One training step of the user's loop: the next batch from a pinned 2-worker DataLoader,
    autocast where the precision asks for it, `micro` micro-batches, the optimizer (through a
    GradScaler under fp16), and `loss.item()` every READ_EVERY steps."""

    def __init__(
        self,
        workload: Workload,
        forward: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        spec: Mapping[str, Any],
        device: torch.device,
        precision: str | None,
    ) -> None:
        self.workload, self.forward, self.optimizer, self.device = (
            workload,
            forward,
            optimizer,
            device,
        )
        self.compile_mode = spec.get("compile")
        self.micro = 1
        loader = torch.utils.data.DataLoader(
            workload.dataset,
            batch_size=workload.batch_size,
            shuffle=False,
            num_workers=2,
            pin_memory=device.type == "cuda",
            collate_fn=workload.collate_fn,
            persistent_workers=True,
        )
        self.dtype = {"bf16-autocast": torch.bfloat16, "fp16-autocast": torch.float16}.get(
            precision or ""
        )
        self.scaler = torch.amp.GradScaler(device.type) if precision == "fp16-autocast" else None
        self.batches = _batches(loader)
        self.losses: list[float] = []

    def __call__(self, index: int) -> None:
        device, micro, scaler = self.device, self.micro, self.scaler
        batch = tuple(t.to(device, non_blocking=True) for t in next(self.batches))
        if self.compile_mode == "reduce-overhead":
            # Inductor's graphs reuse their output buffers: mark where a new iteration begins.
            torch.compiler.cudagraph_mark_step_begin()
        autocast = (
            torch.autocast(device.type, self.dtype)
            if self.dtype is not None
            else contextlib.nullcontext()
        )
        pieces = zip(*(t.chunk(micro) for t in batch), strict=True) if micro > 1 else [batch]
        for piece in pieces:
            with autocast:
                loss = self.workload.loss_fn(self.forward, piece)
            if micro > 1:
                loss = loss / micro
            if scaler is not None:
                scaler.scale(loss).backward()
            else:
                loss.backward()
        if scaler is not None:
            scaler.step(self.optimizer)
            scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        if (index + 1) % READ_EVERY == 0:
            self.losses.append(loss.item())  # the user's sync: read the loss every 10 steps


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _halve_until_it_fits(step: _UserStep, device: torch.device) -> None:
    """Halve the micro-batch until one step fits, as a user reruns after each out-of-memory."""
    while not _fits(step, device):
        step.optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if step.micro * 2 > step.workload.samples_per_batch:
            raise torch.cuda.OutOfMemoryError("one sample per micro-batch does not fit")
        step.micro *= 2


def _timed(
    workload: Workload,
    forward: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    spec: Mapping[str, Any],
    device: torch.device,
    precision: str | None,
    warmup: int,
    windows: int,
    window_steps: int,
    started: float,
) -> Run:
    """`warmup` steps of the user's loop, then `windows` windows of `window_steps` steps, each
    device-synchronised at both ends; `started`: when the loop's set-up began."""
    step = _UserStep(workload, forward, optimizer, spec, device, precision)
    if spec.get("accumulate") == "halves":
        _halve_until_it_fits(step, device)
    for index in range(warmup):
        step(index)
    _sync(device)
    warm_s = time.perf_counter() - started
    windows_ms = []
    index = warmup
    for _ in range(windows):
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(window_steps):
            step(index)
            index += 1
        _sync(device)
        windows_ms.append((time.perf_counter() - t0) * 1e3 / window_steps)
    # The loader's persistent workers end when the step (holding it) is collected, once this
    # function returns.
    steady_s = statistics.median(windows_ms) / 1e3
    cuda = device.type == "cuda"
    return Run(
        windows_ms=windows_ms,
        setup_s=max(0.0, warm_s - warmup * steady_s),
        losses=step.losses,
        peak_memory_bytes=torch.cuda.max_memory_allocated(device) if cuda else None,
        micro_batches=step.micro,
    )
