"""`LoopConfig`: every speed setting of the training loop, typed and validated when built.

The defaults are the PyTorch idiom: one stream, the loss read back every step, no pinning, no
prefetch, no graph, no compiler, the workload's optimizer as built. What each setting does on the
GPU is documented on its field and, in more detail, where it happens (`trainers/core.py` builds
the parts: streams, feed, step, harvester).
Which settings combine is decided here, once: `LoopConfig` refuses an invalid combination, and
`invalid_reason` tells a search space which combinations to leave out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from trainers.errors import ConfigError, did_you_mean
from trainers.levers import (
    LEVERS,
    MAX_BUCKET_CAP_MB,
    MAX_PREFETCH,
    MAX_STREAMS,
    MAX_WORKERS,
    Checkpointing,
    CompileMode,
    CompileScope,
    OptimizerChoice,
    Parallel,
    SyncMode,
    Value,
    compile_modes,
    one_of,
    records_graphs,
)
from trainers.levers.declare import FIELD_LEVERS, conflict
from trainers.precision import check_precision

if TYPE_CHECKING:
    from torch import nn

__all__ = [
    "CHECKPOINTING",
    "CHECKPOINT_SHARES",
    "COMPILE_MODES",
    "COMPILE_SCOPES",
    "DDP_FIELDS",
    "FSDP_FIELDS",
    "INERT",
    "MAX_BUCKET_CAP_MB",
    "MAX_PREFETCH",
    "MAX_STREAMS",
    "MAX_WORKERS",
    "MICRO_BATCHES",
    "OPTIMIZERS",
    "PARALLELS",
    "REFERENCE",
    "SYNC_MODES",
    "Checkpointing",
    "CompileMode",
    "CompileScope",
    "LoopConfig",
    "OptimizerChoice",
    "Parallel",
    "SyncMode",
    "canonical",
    "check_setting",
    "device_error",
    "field_names",
    "invalid_reason",
]

# The allowed values live in the lever table (`trainers.levers`); these are their public names.
SYNC_MODES: tuple[str, ...] = LEVERS["sync_mode"].choices()
COMPILE_MODES: tuple[str, ...] = LEVERS["compile"].choices()
OPTIMIZERS: tuple[str, ...] = LEVERS["optimizer"].choices()
COMPILE_SCOPES: tuple[str, ...] = LEVERS["compile_scope"].choices()
CHECKPOINTING: tuple[str, ...] = LEVERS["activation_checkpointing"].choices()
PARALLELS: tuple[str, ...] = LEVERS["parallel"].choices()
MICRO_BATCHES: tuple[int, ...] = tuple(int(v) for v in LEVERS["micro_batches"].values())
CHECKPOINT_SHARES: tuple[float, ...] = tuple(float(v) for v in LEVERS["checkpoint_share"].values())

DDP_FIELDS = ("bucket_cap_mb", "gradient_as_bucket_view", "static_graph")
"""DDP's own settings: they mean something with parallel='ddp' only."""
FSDP_FIELDS = ("reshard_after_forward", "fsdp_prefetch")
"""FSDP2's own settings: they mean something with parallel='fsdp2' only."""


def check_setting(field: str, value: object) -> None:
    """ConfigError naming `field` unless `value` is one of its allowed values, whatever the
    other settings are (the combinations are LoopConfig's to check)."""
    LEVERS[field].check(value)


INERT: dict[str, tuple[str, tuple[object, ...], object]] = {
    "checkpoint_share": ("activation_checkpointing", ("none",), 1.0),
    # Nothing is compiled per block without a compile mode that allows it (the rule below).
    "compile_scope": (
        "compile",
        tuple(m for m in compile_modes() if m not in compile_modes(graphs=False, compiled=True)),
        "model",
    ),
    "bucket_cap_mb": ("parallel", ("none", "fsdp2"), 25),
    "gradient_as_bucket_view": ("parallel", ("none", "fsdp2"), False),
    "static_graph": ("parallel", ("none", "fsdp2"), False),
    "reshard_after_forward": ("parallel", ("none", "ddp"), True),
    "fsdp_prefetch": ("parallel", ("none", "ddp"), False),
}
"""Settings that mean nothing while another one has one of some values: name -> (the other
setting, the values at which this one is inert, this one's default). `canonical` resets them, so
a search that samples them independently never builds a refused or duplicate config."""


def canonical(values: Mapping[str, Any], *, pinned: Collection[str] = ()) -> dict[str, Any]:
    """`values` with every inert setting (`INERT`, then a lever's own `inert` rule, which may
    read the settings INERT reset) back at its default. A lever named in `pinned` (a user's
    pin) keeps its value under its own rule, so that `conflicts` refuses it in one line rather
    than a search running something else in silence."""
    out = dict(values)
    defaults = {name: item.default for name, item in LEVERS.items()}
    for name, (other, inert_at, default) in INERT.items():
        if name in out and out.get(other, defaults[other]) in inert_at:
            out[name] = default

    def get(other: str) -> Any:
        return out.get(other, defaults[other])

    for name, item in LEVERS.items():
        moved = out.get(name, item.default) != item.default
        if moved and name not in pinned and item.inert is not None and item.inert(get):
            out[name] = item.default
    return out


def _check_scale_combination(config: LoopConfig) -> None:
    if config.activation_checkpointing == "none" and config.checkpoint_share != 1.0:
        raise ConfigError(
            "checkpoint_share",
            config.checkpoint_share,
            "1.0 with activation_checkpointing='none' (the share says which blocks recompute)",
        )
    per_block = compile_modes(graphs=False, compiled=True)
    if config.compile_scope == "blocks" and config.compile not in per_block:
        raise ConfigError(
            "compile_scope",
            config.compile_scope,
            "'model' with compile="
            f"{config.compile!r} (compiling each block needs compile={one_of(per_block)}; "
            "Inductor's cudagraph trees per block are not proven)",
        )
    if config.micro_batches > 1 and records_graphs(config.compile):
        # The cudagraph trees keep a backward's gradients in their own memory, which the next
        # micro-batch's replay may overwrite (pytorch/pytorch#96693): unverified, refused.
        raise ConfigError(
            "micro_batches",
            config.micro_batches,
            f"1 with compile={config.compile!r} (its CUDA graphs may overwrite the gradients of "
            "the earlier micro-batches); compile='default' with cuda_graph=True accumulates",
        )
    if config.cuda_graph and config.activation_checkpointing != "none":
        raise ConfigError(
            "activation_checkpointing",
            config.activation_checkpointing,
            "'none' with cuda_graph=True (the checkpoint saves and restores the random-number "
            "state around the recompute, which a capture does not allow; not yet proven on a "
            "GPU); over a compiled float8 step a whole-step graph gave 1.01-1.04x at 0.5-1.1B "
            "(docs/benchmarks/README.md, 2026-12-04)",
        )


_DP_CUDA_GRAPH = {
    "ddp": (
        "a whole-step CUDA graph over DDP needs DDP built on the capture's side stream, 11 or "
        "more eager DDP steps before the capture and NCCL's asynchronous error handling off "
        "(PyTorch's CUDA-graph notes), and is not yet proven here on several GPUs"
    ),
    "fsdp2": (
        "FSDP2 all-gathers each block's parameters into memory it allocates and frees every "
        "step on its own streams, which a capture cannot replay"
    ),
}


def _check_parallel_combination(config: LoopConfig) -> None:
    """The data-parallel levers' rules (`trainers.parallel` applies them)."""
    for field in (*DDP_FIELDS, *FSDP_FIELDS):
        owner = "ddp" if field in DDP_FIELDS else "fsdp2"
        default = INERT[field][2]
        value = getattr(config, field)
        if config.parallel != owner and value != default:
            raise ConfigError(
                field,
                value,
                f"{default!r} with parallel={config.parallel!r} ({field} is a setting of "
                f"{owner}: it applies with parallel={owner!r} only)",
            )
    if config.parallel == "none":
        return
    if config.cuda_graph:
        raise ConfigError(
            "cuda_graph",
            config.cuda_graph,
            f"false with parallel={config.parallel!r} ({_DP_CUDA_GRAPH[config.parallel]})",
        )
    if records_graphs(config.compile):
        raise ConfigError(
            "compile",
            config.compile,
            f"{one_of(compile_modes(graphs=False))} with parallel={config.parallel!r} "
            "(Inductor's CUDA graphs around DDP's all-reduce hooks or FSDP2's all-gathers are "
            "not proven here; compile='default' over DDP splits the compiled graph at the "
            "gradient buckets, so each bucket's all-reduce overlaps the rest of the backward)",
        )


def _check_combination(config: LoopConfig) -> None:
    """The combinations LoopConfig's docstring lists as refused, each with its reason."""
    _check_scale_combination(config)
    _check_parallel_combination(config)
    if config.cuda_graph and records_graphs(config.compile):
        raise ConfigError(
            "compile",
            config.compile,
            f"{one_of(compile_modes(graphs=False))} with cuda_graph=True (Inductor's "
            "cudagraph trees cannot be captured inside the whole-step CUDA graph; "
            "compile='default' with cuda_graph=True captures the compiled step instead)",
        )
    if config.cuda_graph and config.optimizer == "compiled":
        raise ConfigError(
            "optimizer",
            config.optimizer,
            "as-built, foreach or fused with cuda_graph=True (a compiled optimizer step is not "
            "yet proven to capture, and inside one graph fused does the same work); "
            "use optimizer='fused'",
        )


@dataclasses.dataclass(kw_only=True, slots=True, frozen=True)
class LoopConfig:
    """How the training loop uses streams, syncs, the data pipeline, CUDA graphs, the compiler
    and the optimizer's implementation.

    num_streams: 1 = everything on the current stream (the PyTorch idiom); 2 = transfer + compute;
        3 = transfer + forward + backward/optimizer; 4 = two transfer streams used alternately
        (two batches in flight) + forward + backward/optimizer. Under PyTorch's semantics each
        backward kernel runs on the stream of its forward op, so the "backward" stream only makes
        the seed gradient, runs the optimizer step and orders itself after the forward.
    sync_interval: the host waits for the GPU and extracts the losses every N steps.
    sync_mode: `synchronize` = torch.cuda.synchronize() at each sync point; `event` = an event
        recorded on the last stream that does work, Event.synchronize() at each sync point;
        `query` = each loss copied non-blocking into pinned host memory behind an event and
        harvested once Event.query() is true; the host blocks only in the final drain.
    prefetch_depth: batches copied to the device ahead of the step that uses them (0: just in time).
    pin_memory: the DataLoader returns page-locked batches (copies overlap compute only from those).
    non_blocking: host-to-device copies are asynchronous with respect to the host.
    num_workers: DataLoader worker processes (0 = batches are made in the training process).
    cuda_graph: forward + backward + optimizer step captured once in a CUDA graph and replayed.
        Composes with `compile` and `optimizer`: the compiled forward and backward and the
        (foreach or fused, capturable) optimizer are captured together as one graph. That
        combination was the fastest on the transformer presets on an H100 (2026-11-23), and
        once hit an illegal memory access there: tests/trainers/test_levers_gpu.py is its proof
        on a GPU.
    compile: `torch.compile(model, mode=...)` of the model's forward; AOTAutograd compiles the
        backward. `none` = eager. `reduce-overhead` adds Inductor's own CUDA graphs (cudagraph
        trees) over forward and backward, with the optimizer left outside them. Compilation
        happens in the first warm-up step; `RunResult.compile_s` says what it cost (0 for a run
        that kept the code of the process's last run of the same model build and arithmetic:
        `RunResult.compile_kept_s` then says what that code cost). Set
        TORCHINDUCTOR_CACHE_DIR (or use `trainers.compile_cache_dir`) to share Inductor's
        on-disk caches between processes.
    optimizer: `as-built` = the workload's optimizer as its factory builds it; `foreach` /
        `fused` = rebuilt with foreach=True / fused=True (same hyper-parameters; `fused` only for
        optimizers whose constructor takes it, such as Adam, AdamW and SGD); `compiled` = its
        `step` wrapped in `torch.compile`.
    micro_batches: 1, 2, 4 or 8: each step's batch is split (along its first dimension) into that
        many micro-batches, each forward and backward in turn with its loss divided by their
        count, one optimizer step after the last: the optimizer sees the same batch and the same
        number of steps, the activations of one micro-batch at a time are alive. Under a
        whole-step CUDA graph all micro-steps are in the one graph. Where a model has batch
        statistics (BatchNorm) this changes the results: the gate decides.
    activation_checkpointing: `none`; `blocks` = `torch.utils.checkpoint` (non-reentrant) around
        the model's repeated blocks (`trainers.blocks`), which keep only their inputs and run
        their forward again in the backward; `selective` = the same with PyTorch's selective
        policy: matmul, convolution and attention outputs kept, the cheap ops recomputed
        (`trainers.recompute`).
    checkpoint_share: 0.25, 0.5 or 1.0: the share of the blocks checkpointed (the first ones).
    compile_scope: `model` = `torch.compile` of the whole model; `blocks` = each repeated block
        compiled on its own (regional compilation: one compile reused by every block).
    parallel: `none` = one process trains alone; `ddp` = DistributedDataParallel, each process a
        replica that all-reduces its gradients, bucket by bucket, on NCCL's (gloo's) own streams
        while the backward goes on; `fsdp2` = `torch.distributed.fsdp.fully_shard` of each
        repeated block and of the model: parameters, gradients and optimizer state sharded,
        each block's parameters all-gathered before its forward and backward, its gradients
        reduce-scattered after. Either runs under torchrun (`trainers.distributed`, the tuner's
        `--nproc-per-node`), each process on its shard of the global batch
        (`trainers.parallel`). With `compile`, DDP's model is compiled around the wrapper
        (Dynamo's DDPOptimizer splits the graph at the buckets, so their all-reduces still
        overlap the backward); FSDP2 composes with each block compiled (compile_scope='blocks')
        or the whole model compiled around its hooks.
    bucket_cap_mb (ddp): the size of DDP's gradient buckets in MiB (DDP's default 25): smaller
        buckets start their all-reduce earlier in the backward, larger ones launch fewer.
    gradient_as_bucket_view (ddp): the gradients are views into the buckets: no copy into the
        bucket before each all-reduce, and less memory.
    static_graph (ddp): the set of parameters used and the hook order stay the same every step:
        DDP may skip its per-step search for unused parameters and reorder its buckets.
    reshard_after_forward (fsdp2): free each block's gathered parameters after its forward (less
        memory, one more all-gather in the backward) or keep them to the backward.
    fsdp_prefetch (fsdp2): explicit prefetch: each block's forward all-gathers the next block's
        parameters, and its backward the previous block's, instead of FSDP2's implicit order.

    Combinations refused, and why:
    - cuda_graph=True with compile="reduce-overhead": two CUDA-graph systems over one step.
      Inductor's cudagraph trees capture and replay on their own and cannot be captured inside
      the loop's whole-step capture; compile="default" under cuda_graph=True is the same idea.
    - cuda_graph=True with optimizer="compiled": not yet shown to capture on a GPU (the probe
      in tests/trainers/test_levers_gpu.py says when this rule can go), and inside one
      graph it has little to win over optimizer="fused": launch overhead is gone either way and
      the fused kernel already reads and writes each state tensor once per step.
    - checkpoint_share other than 1.0 with activation_checkpointing='none'; compile_scope='blocks'
      with compile 'none' or 'reduce-overhead'; micro_batches > 1 with compile='reduce-overhead'
      (its CUDA graphs may overwrite earlier micro-batches' gradients); activation checkpointing
      with cuda_graph=True (the recompute's random-number bookkeeping cannot be captured).
    - a DDP setting with parallel other than 'ddp', an FSDP2 setting with parallel other than
      'fsdp2' (each is inert there); parallel 'ddp' or 'fsdp2' with cuda_graph=True (DDP's capture
      needs setup not proven here; FSDP2's per-step allocations cannot be captured) or with
      compile='reduce-overhead' (Inductor's CUDA graphs around the collectives, not proven).
    Refused at run start, not here, since they depend on the run: cuda_graph=True and
    compile="reduce-overhead" need a CUDA device; precision="fp16-autocast" does not combine
    with cuda_graph=True (see `trainers.precision`).
    """

    num_streams: int = 1
    sync_interval: int = 1
    sync_mode: SyncMode = "synchronize"
    prefetch_depth: int = 0
    pin_memory: bool = False
    non_blocking: bool = False
    num_workers: int = 0
    cuda_graph: bool = False
    compile: CompileMode = "none"
    optimizer: OptimizerChoice = "as-built"
    micro_batches: int = 1
    activation_checkpointing: Checkpointing = "none"
    checkpoint_share: float = 1.0
    compile_scope: CompileScope = "model"
    parallel: Parallel = "none"
    bucket_cap_mb: int = 25
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    reshard_after_forward: bool = True
    fsdp_prefetch: bool = False

    modules: tuple[tuple[str, Value], ...] = ()
    """The values of the levers declared in modules of their own (`trainers.levers`), as
    (name, value) pairs; kept in table order and only off their defaults, so two configs that
    mean the same compare equal. Read them with `get`; `from_dict` and `replace` set them."""

    def __post_init__(self) -> None:
        for name in LEVERS:
            if name in FIELD_LEVERS:
                check_setting(name, getattr(self, name))
        given = dict(self.modules)
        for name, value in given.items():
            if name in FIELD_LEVERS or name not in LEVERS:
                raise ConfigError(name, value, a_field(name))
            check_setting(name, value)
        kept = tuple(
            (name, given[name])
            for name in LEVERS
            if name in given and given[name] != LEVERS[name].default
        )
        object.__setattr__(self, "modules", kept)
        _check_combination(self)
        refused = conflict(self.get)  # a lever module's own rule beside the other levers
        if refused is not None:
            raise refused

    def get(self, name: str) -> Value:
        """The value of lever `name`, a field or a lever module's (KeyError for no lever)."""
        if name in FIELD_LEVERS:
            value: Value = getattr(self, name)
            return value
        default = LEVERS[name].default
        return dict(self.modules).get(name, default)

    def to_dict(self) -> dict[str, Any]:
        """Every lever's value by name, in table order (a lever module's too, at its default)."""
        return {name: self.get(name) for name in field_names()}

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> LoopConfig:
        """Build from a mapping; an unknown key is an error that names it and lists the fields."""
        names = field_names()
        for key in values:
            if key not in names:
                raise ConfigError(key, values[key], a_field(key))
        fields = {k: v for k, v in values.items() if k in FIELD_LEVERS}
        modules = tuple((k, v) for k, v in values.items() if k not in FIELD_LEVERS)
        return cls(**fields, modules=modules)

    def replace(self, **changes: Any) -> LoopConfig:
        return LoopConfig.from_dict({**self.to_dict(), **changes})


def field_names() -> tuple[str, ...]:
    """Every lever's name, in table order: `LoopConfig`'s fields, then the lever modules'."""
    return tuple(LEVERS)


def a_field(name: str) -> str:
    """What a lever's name may be, the closest to `name` first: the allowed-values text of an
    unknown name's ConfigError/SpaceError."""
    if name == "modules":  # LoopConfig's keyword that holds the lever modules' values
        names = ", ".join(field_names())
        return f"a lever's own name (modules holds the lever modules' values): {names}"
    return f"a LoopConfig field{did_you_mean(name, field_names())}: {', '.join(field_names())}"


def device_error(config: LoopConfig, device_type: str) -> str | None:
    """Why `config` cannot run on a device of `device_type` ("cpu", "cuda"), or None: the first
    lever, in table order, whose `refuse_on` refuses its value there."""
    for name, item in LEVERS.items():
        reason = item.refusal(config.get(name), device_type)
        if reason is not None:
            return reason
    return None


def precision_error(config: LoopConfig, precision: str) -> ConfigError | None:
    """The ConfigError of the first lever, in table order, whose `refuse_in` refuses its value
    in `precision`, or None."""
    for name, item in LEVERS.items():
        error = item.precision_refusal(config.get(name), precision)
        if error is not None:
            return error
    return None


def model_error(config: LoopConfig, model: nn.Module) -> ConfigError | None:
    """The ConfigError of the first lever, in table order, whose `refuse_for` refuses its value
    for `model`, or None."""
    for name, item in LEVERS.items():
        error = item.model_refusal(config.get(name), model)
        if error is not None:
            return error
    return None


def invalid_reason(
    values: Mapping[str, Any],
    *,
    precision: str | None = None,
    device_type: str | None = None,
    model: nn.Module | None = None,
) -> str | None:
    """Why the LoopConfig `values` (a partial dict is completed with the defaults) is invalid, or
    None if it is valid; with `precision`, `device_type` and the workload's `model`, also for
    that run.

    The one predicate a search space needs to leave out invalid combinations: it applies exactly
    the rules `LoopConfig` and `run()` apply.
    """
    try:
        config = LoopConfig.from_dict(values)
        if precision is not None:
            check_precision(precision, cuda_graph=config.cuda_graph, parallel=config.parallel)
            refused = precision_error(config, precision)
            if refused is not None:
                raise refused
    except ConfigError as exc:
        return str(exc)
    if device_type is not None:
        reason = device_error(config, device_type)
        if reason is not None:
            return reason
    # Last: a model rule may import a library (liger-kernel) that a device rule refuses first.
    refused = None if model is None else model_error(config, model)
    return None if refused is None else str(refused)


REFERENCE = LoopConfig()
"""The parity reference and the `pytorch-default` baseline: 1 stream, synchronize every step."""
