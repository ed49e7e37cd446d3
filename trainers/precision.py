"""Numeric precision of a run: a property of the experiment, fixed for a study and never tuned.

Unlike a `LoopConfig` setting, precision changes the results (the losses), not only the speed, so
it is chosen with the workload and passed to `run(..., precision=...)`:
- `fp32`: float32 everywhere; `torch.set_float32_matmul_precision("highest")` for the run.
- `tf32`: float32 tensors, matmuls and convolutions in TF32 (`"high"`); CUDA Ampere and later.
- `bf16-autocast`: `torch.autocast(device, torch.bfloat16)` around forward and loss; backward
  follows the casts autocast recorded. No loss scaling: bfloat16 has float32's exponent range.
- `fp16-autocast`: float16 autocast plus `torch.amp.GradScaler`, which scales the loss so small
  gradients do not flush to zero and skips the optimizer step when a gradient overflowed.
- `float8`: bf16-autocast plus torchao's float8 training conversion of the model's eligible
  `nn.Linear` layers (`trainers.float8`: which ones, and where it runs: a CUDA GPU of compute
  capability 8.9 or later with torchao installed; `check_precision_here` refuses it elsewhere).
  The conversion is a model transform, applied by the loop core before compilation.
Under autocast the remaining float32 matmuls run at "highest": the precision is the one change.
The process's matmul precision comes back when the run ends.

The older, process-wide knob, `matmul_precision` (`torch.set_float32_matmul_precision`: highest,
high or medium), is owned here too: `set_matmul_precision` is its one setter, and
`check_precisions` the one rule between the two (a run names one of them, not both).
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Literal, cast, get_args

import torch

from trainers import float8
from trainers.errors import ConfigError, UnsupportedOnDevice

Precision = Literal["fp32", "tf32", "bf16-autocast", "fp16-autocast", "float8"]
PRECISIONS: tuple[str, ...] = get_args(Precision)

MATMUL_PRECISION: dict[str, str] = {
    "fp32": "highest",
    "tf32": "high",
    "bf16-autocast": "highest",
    "fp16-autocast": "highest",
    "float8": "highest",
}
"""`torch.set_float32_matmul_precision` value each precision runs under."""

MatmulPrecision = Literal["highest", "high", "medium"]
MATMUL_PRECISIONS: tuple[str, ...] = get_args(MatmulPrecision)
"""`torch.set_float32_matmul_precision` values: highest (PyTorch's default), high (TF32), medium."""

_AUTOCAST_DTYPE: dict[str, torch.dtype] = {
    "bf16-autocast": torch.bfloat16,
    "fp16-autocast": torch.float16,
    # float8's converted linears cast to float8 themselves; the rest of the model runs in bf16.
    "float8": torch.bfloat16,
}


def check_precision(value: object, *, cuda_graph: bool, parallel: str = "none") -> None:
    """Raise ConfigError naming `precision` unless `value` is a precision usable with the config.

    fp16-autocast with cuda_graph=True is refused: `GradScaler.step` decides on the host whether
    the gradients overflowed (`.item()` on its found-inf flag, a device sync) for every optimizer
    that cannot take the scale as a tensor, and neither a host sync nor a host decision can be
    captured in a graph. bf16 has float32's exponent range and needs no scaler.
    float8 with parallel='fsdp2' is refused until a GPU test passes it: FSDP2 shards the
    converted layers' weights into DTensors, which torchao all-gathers in bf16 or, with
    `Float8LinearConfig(enable_fsdp_float8_all_gather=True)`, in float8; neither has run here
    (float8 needs a GPU of compute capability 8.9 or later, and no such run exists yet).
    """
    if value is None:
        raise ConfigError("precision", value, f"one of {', '.join(PRECISIONS)}")
    parse_precision(value)
    if value == "float8" and parallel == "fsdp2":
        raise ConfigError(
            "precision",
            value,
            "fp32, tf32, bf16-autocast or fp16-autocast with parallel='fsdp2'; float8 with "
            "parallel='ddp' or 'none' (FSDP2 shards float8's converted weights, and torchao's "
            "float8 all-gather, enable_fsdp_float8_all_gather, has passed no GPU test here)",
        )
    if value == "fp16-autocast" and cuda_graph:
        raise ConfigError(
            "precision",
            value,
            "fp32, tf32 or bf16-autocast with cuda_graph=True (fp16's GradScaler decides on "
            "the host whether to skip the step, which a CUDA graph cannot replay); "
            "use bf16-autocast",
        )


def check_precision_here(
    precision: object, device: torch.device, model: torch.nn.Module | None = None
) -> None:
    """UnsupportedOnDevice, in one line naming `precision`, where `device` or this install cannot
    run `precision`: float8 needs a CUDA GPU of compute capability 8.9 or later and torchao
    (`trainers.float8.unavailable`). The other precisions are probed by `make_plan`. With
    `model`, a ConfigError where its parameters cannot take it (`check_scaled_parameters`)."""
    if model is not None:
        check_scaled_parameters(precision, model)
    if precision == "float8":
        reason = float8.unavailable(device)
        if reason is not None:
            raise UnsupportedOnDevice(reason)


def tf32_unused(device: torch.device) -> str | None:
    """Why `tf32` computes as `fp32` on `device` (None: it does not): TF32 is the format of
    NVIDIA's tensor cores from Ampere (compute capability 8.0) on; elsewhere PyTorch takes the
    setting and runs float32, so a study in tf32 there measures fp32 under another name (a CPU
    run said nothing of it, 2026-12-04)."""
    if device.type != "cuda":
        return f"on {device.type} tf32 computes as fp32 (TF32 is NVIDIA's tensor-core format)"
    major, minor = torch.cuda.get_device_capability(device)
    if major < 8:
        return (
            f"this GPU (compute capability {major}.{minor}) computes tf32 as fp32: TF32 needs "
            "an Ampere GPU or later (8.0)"
        )
    return None


def check_matmul_precision(value: object) -> None:
    """ConfigError naming `matmul_precision` unless `value` is one of MATMUL_PRECISIONS."""
    if not isinstance(value, str) or value not in MATMUL_PRECISIONS:
        raise ConfigError("matmul_precision", value, ", ".join(MATMUL_PRECISIONS))


def check_precisions(precision: object, matmul_precision: object) -> None:
    """The one rule between a run's `precision` and the process's `matmul_precision`: each valid,
    and not both set (a precision sets the matmul precision itself; "highest" is the unset
    default). ConfigError naming the field at fault."""
    check_matmul_precision(matmul_precision)
    if precision is None:
        return
    parse_precision(precision)
    if matmul_precision != "highest":
        raise ConfigError(
            "precision",
            precision,
            "either precision or matmul_precision, not both (precision tf32 is matmul_precision "
            f"high; this run has matmul_precision {matmul_precision!r})",
        )


def parse_precision(value: object, field: str = "precision") -> Precision | None:
    """`value` as a Precision (None stays None); ConfigError naming `field` for anything else.
    The one membership check: a precision read from a flag, a JSON body, a file or the
    environment goes through here."""
    if value is None:
        return None
    if not isinstance(value, str) or value not in PRECISIONS:
        raise ConfigError(field, value, f"one of {', '.join(PRECISIONS)}")
    return cast(Precision, value)


@dataclasses.dataclass(frozen=True, slots=True)
class PrecisionSpec:
    """A study's precision as one typed value, built and validated once, by `PrecisionSpec.of`,
    where a request enters (the CLI's flags, the service's job, `RunOptions`):

    precision: the reference precision, the one the baselines and the gate's reference run in;
        None keeps the process's float32 matmul precision and no autocast;
    allowed: the precisions a trial may run in: `(precision,)`, or the precisions the search
        chooses among (the reference first among equals), or () with no precision named;
    matmul: the float32 matmul precision a study without a precision runs under.

    Each run then takes one of `allowed` as `RunArgs.precision`, which the step applies
    (`make_plan`, `matmul_precision_for`).
    """

    precision: Precision | None = None
    allowed: tuple[Precision, ...] = ()
    matmul: MatmulPrecision = "highest"

    @classmethod
    def of(
        cls,
        precision: object = None,
        precisions: Sequence[object] | None = None,
        matmul_precision: object = "highest",
        *,
        nproc_per_node: int = 1,
        program: str | None = None,
    ) -> PrecisionSpec:
        """Every rule between a request's `precision`, `precisions` and `matmul_precision`,
        ConfigError naming the field at fault: each value known; `precisions` not empty, each
        once, `precision` among them (else their first is the reference); several only for a
        single-process study of the built-in loop (`nproc_per_node` > 1 and a `program` each run
        a gate that judges one precision); a precision or a matmul precision, not both."""
        check_matmul_precision(matmul_precision)
        reference = parse_precision(precision)
        allowed: tuple[Precision, ...] = () if reference is None else (reference,)
        if precisions is not None:
            allowed = _allowed(precisions)
            if reference is not None and reference not in allowed:
                raise ConfigError(
                    "precision",
                    reference,
                    f"one of precisions ({', '.join(allowed)}): the reference precision is one "
                    "of the precisions the study may choose",
                )
            reference = allowed[0] if reference is None else reference
            _one_unless_searchable(allowed, nproc_per_node=nproc_per_node, program=program)
        check_precisions(reference, matmul_precision)
        return cls(
            precision=reference, allowed=allowed, matmul=cast(MatmulPrecision, matmul_precision)
        )

    @property
    def searched(self) -> bool:
        """Whether precision is a searched dimension (two or more allowed)."""
        return len(self.allowed) > 1


def _allowed(precisions: Sequence[object]) -> tuple[Precision, ...]:
    values = tuple(precisions)
    if not values:
        raise ConfigError("precisions", "", f"one or more of {', '.join(PRECISIONS)}")
    if None in values:
        raise ConfigError("precisions", None, f"each one of {', '.join(PRECISIONS)}")
    allowed = tuple(cast(Precision, parse_precision(v, "precisions")) for v in values)
    twice = sorted({v for v in allowed if allowed.count(v) > 1})
    if twice:
        joined = ",".join(allowed)
        raise ConfigError("precisions", joined, f"each precision once ({', '.join(twice)} twice)")
    return allowed


def _one_unless_searchable(
    allowed: tuple[Precision, ...], *, nproc_per_node: int, program: str | None
) -> None:
    if len(allowed) < 2:
        return
    if nproc_per_node > 1:
        raise ConfigError(
            "precisions",
            ",".join(allowed),
            "one precision with nproc_per_node > 1 (the data-parallel gate judges one precision)",
        )
    if program is not None:
        raise ConfigError(
            "precisions",
            ",".join(allowed),
            f"one precision for a program ({program} runs its own gate, in one precision)",
        )


def set_matmul_precision(value: str) -> None:
    """Set the process's float32 matmul precision (the one setter; ConfigError for a bad value).
    It changes results, so it is a property of the experiment and never tuned."""
    check_matmul_precision(value)
    torch.set_float32_matmul_precision(value)


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class PrecisionPlan:
    """How a step applies a precision: the autocast around forward+loss and the loss scaler.

    The default plan (no autocast, no scaler) is plain float32 arithmetic; the matmul precision is
    a process setting, applied around the whole run by `matmul_precision_for`.
    """

    device_type: str = "cpu"
    autocast_dtype: torch.dtype | None = None
    scaler: torch.amp.GradScaler | None = None

    def autocast(self) -> contextlib.AbstractContextManager[object]:
        """The context for forward and loss: autocast for the *-autocast precisions, else none."""
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        # cache_enabled=False: autocast otherwise keeps the low-precision copy of each weight
        # that it made at the first use in the context and hands it out again until the context
        # exits. Inside a CUDA-graph capture that copy is a tensor of the graph's pool which the
        # cache drops on exit, while the graph keeps reading its address; without the cache every
        # forward casts the weights again, which a replay must do anyway since the optimizer has
        # changed them. Off for eager steps too, so graph and eager do the same arithmetic.
        return torch.autocast(self.device_type, dtype=self.autocast_dtype, cache_enabled=False)

    def backward(self, loss: torch.Tensor) -> None:
        # fp16: the loss is scaled so that small float16 gradients do not flush to zero.
        seed = loss if self.scaler is None else self.scaler.scale(loss)
        seed.backward()

    def step(
        self, optimizer: torch.optim.Optimizer, before_step: Callable[[], None] | None = None
    ) -> None:
        """The optimizer step; `before_step` (gradient clipping) runs on the true gradients
        first: for fp16 they are unscaled before it."""
        if self.scaler is None:
            if before_step is not None:
                before_step()
            optimizer.step()
            return
        if before_step is not None:
            # The gradients are still multiplied by the loss scale: a clip must see their real
            # norm. unscale_ marks the optimizer so scaler.step does not unscale them twice.
            self.scaler.unscale_(optimizer)
            before_step()
        # Host sync for optimizers that cannot take the scale as a tensor: GradScaler reads the
        # found-inf flag with .item() to decide whether to skip the step. Fused optimizers get
        # the scale and the flag as device tensors and do not sync.
        self.scaler.step(optimizer)
        # Device-side: grows or backs off the scale with no host read.
        self.scaler.update()


def make_plan(precision: Precision | None, device: torch.device) -> PrecisionPlan:
    """The plan for `precision` on `device`; UnsupportedOnDevice if its autocast does not work.

    Autocast with a dtype the device does not support only warns and runs in float32, which
    would label a float32 run as bf16/fp16; a tiny matmul under the autocast finds out first.
    float8's plan is bf16-autocast's (its conversion is a model transform, `trainers.float8`),
    refused first where float8 cannot run.
    """
    check_precision_here(precision, device)
    if precision is None or precision not in _AUTOCAST_DTYPE:
        return PrecisionPlan(device_type=device.type)
    dtype = _AUTOCAST_DTYPE[precision]
    reason = _autocast_failure(device, dtype)
    if reason is not None:
        raise UnsupportedOnDevice(
            f"precision={precision!r}: {device.type} autocast cannot run {dtype} here "
            f"(torch {torch.__version__}): {reason}"
        )
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16-autocast" else None
    return PrecisionPlan(device_type=device.type, autocast_dtype=dtype, scaler=scaler)


def check_scaled_parameters(precision: object, model: torch.nn.Module) -> None:
    """ConfigError naming `precision` where an autocast meets a model whose trained parameters
    are all float64 (`_check_float64`), or fp16-autocast's gradient scaler meets a trainable
    float16 parameter: it unscales float32 gradients only, and had raised "Attempting to unscale
    FP16 gradients." at the first step, which the tuner blamed on the workload (a probe,
    2026-12-07)."""
    _check_float64(precision, model)
    if precision != "fp16-autocast":
        return
    for name, param in model.named_parameters():
        if param.requires_grad and param.dtype == torch.float16:
            raise ConfigError(
                "precision",
                precision,
                f"a model whose trained parameters are float32 (its {name} is float16: the "
                "gradient scaler unscales float32 gradients); keep the model in float32, which "
                "autocast runs in float16 where it pays, or choose another precision",
            )


def _check_float64(precision: object, model: torch.nn.Module) -> None:
    """ConfigError naming `precision` where an autocast (or float8, which trains under
    bf16-autocast) meets a model whose trained parameters are all float64: autocast casts only
    float32 ops, so the run trained in float64 under a bf16 label, bit for bit as fp32 did (a
    user's probe, 2026-12-07)."""
    if precision not in _AUTOCAST_DTYPE:
        return
    trained = [p for p in model.parameters() if p.requires_grad and p.is_floating_point()]
    if trained and all(p.dtype == torch.float64 for p in trained):
        raise ConfigError(
            "precision",
            precision,
            "a model whose trained parameters are float32 (this one's are float64, which "
            "autocast leaves as they are: the run would compute in float64 under this label); "
            "give the model and its data .float(), or leave precision out",
        )


def _autocast_failure(device: torch.device, dtype: torch.dtype) -> str | None:
    a = torch.ones(2, 2, device=device)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # "autocast disabled" is only a warning
            with torch.autocast(device.type, dtype=dtype, cache_enabled=False):
                out = a @ a
    except (RuntimeError, UserWarning) as exc:
        return str(exc)
    if out.dtype != dtype:
        return f"a matmul under autocast gave {out.dtype}"
    return None


@contextlib.contextmanager
def matmul_precision_for(precision: Precision | None) -> Iterator[str]:
    """Set the float32 matmul precision for `precision` and yield it; restore the old one after.

    None leaves the process's setting alone (what the caller set, e.g. `--matmul-precision`),
    untouched even on the way out: setting "highest" back over torch's unset default is the same
    arithmetic but another key for Inductor's FX-graph cache, seen as cache misses on CPU.
    """
    if precision is None:
        yield torch.get_float32_matmul_precision()
        return
    previous = torch.get_float32_matmul_precision()
    set_matmul_precision(MATMUL_PRECISION[precision])
    try:
        yield torch.get_float32_matmul_precision()
    finally:
        torch.set_float32_matmul_precision(previous)  # whatever it was, even torch's own value
