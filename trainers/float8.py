"""Float8 matmuls, the precision `float8`: bf16 autocast plus torchao's float8 training
conversion of the model's `nn.Linear` layers.

torchao (`pip install 'streamtune[float8]'`, 0.18) swaps each chosen `nn.Linear` for a
`Float8Linear` that holds the very same weight and bias Parameters: the optimizer, the gradients
and the `state_dict` keys do not change. Its three matmuls (the output, the input's gradient and
the weight's gradient) run as float8 `torch._scaled_mm` with one scale per tensor (the
"tensorwise" recipe: e4m3 for activations and weights, e5m2 for gradients, each scale taken from
the tensor's absolute maximum on the device, every step, with no host sync). Everything else runs
as under bf16-autocast. Float8 changes the numerics: the gate judges it by equivalence, never
bit for bit (`trainers.gate.parity.required_test`).

Which linears are converted (`Float8Plan.of`); every other one stays under bf16 autocast:
- exactly `nn.Linear`: a subclass may not run its own forward (nn.MultiheadAttention reads its
  `out_proj`'s weight directly, so converting that module would convert nothing); or Hugging
  Face's `Conv1D` (GPT-2's projections: `x @ W + b`, W stored in x out), which torchao does not
  convert and a torchao recipe leaves in bf16: here it becomes `Float8Conv1D`, torchao's float8
  matmul given W itself as the transposed weight it takes (`_float8_conv1d`);
- not the output head (the last `nn.Linear` registered, one named `lm_head`, or the model's
  `get_output_embeddings()`): its logits feed the loss, and torchao's and torchtitan's float8
  recipes keep it in high precision. Not "out_features equal to the vocabulary": on a small
  Llama the SwiGLU width can equal it (the tiny preset's 128), and that layer is no head;
- in and out features both multiples of 16, which float8 `torch._scaled_mm` requires.

Where it runs (`unavailable`): a CUDA GPU of compute capability 8.9 or later (float8 tensor
cores: Ada's L4 and RTX 40xx, Hopper's H100 and H200), with torchao importable. Anywhere else
`precision="float8"` is refused with one line that says why, before anything is built.

Measured on one H100 (docs GPU-FACTS, a 1.1B Llama-style decoder, torchao 0.18): tensorwise
float8 with each decoder layer compiled was 1.20x the fastest bf16 loop; under whole-model
compilation 1.03x; eager, it did not fit in 80 GB. The conversion comes before compilation
(torchao's order), so the compiler fuses the scaling into the kernels around each matmul.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import nn

from trainers.errors import ConfigError, UnsupportedOnDevice

MIN_CAPABILITY = (8, 9)
"""The first CUDA compute capability with float8 tensor cores (Ada Lovelace)."""
DIVISOR = 16
"""float8 `torch._scaled_mm` needs both matrix dimensions of the weight in multiples of 16."""
INSTALL = "pip install 'streamtune[float8]'"
RECIPE = "tensorwise"
GPUS = "H100, H200, L4, RTX 40xx"

Undo = Callable[[], None]


_NEEDED = (
    f"float8 matmuls need a CUDA GPU of compute capability "
    f"{MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} or later ({GPUS})"
)


def device_error(device: torch.device) -> str | None:
    """Why `device` cannot run float8 matmuls (naming the GPU and its capability), or None."""
    if device.type != "cuda":
        return f"precision='float8': {_NEEDED}; this run's device is {device.type}"
    return capability_error(
        torch.cuda.get_device_name(device), torch.cuda.get_device_capability(device)
    )


def capability_error(gpu: str, capability: tuple[int, int]) -> str | None:
    """Why the GPU named `gpu`, of compute `capability` (major, minor), cannot run float8
    matmuls, or None where it can."""
    if tuple(capability) >= MIN_CAPABILITY:
        return None
    major, minor = capability
    return (
        f"precision='float8': {gpu} has compute capability {major}.{minor}; {_NEEDED}; "
        "use bf16-autocast on this GPU"
    )


def torchao_error() -> str | None:
    """Why torchao's float8 training API cannot be imported here, or None."""
    try:
        _float8_api()
    except UnsupportedOnDevice as exc:
        return str(exc)
    return None


def unavailable(device: torch.device) -> str | None:
    """Why `precision="float8"` cannot run on `device` here, or None: the device first (on a
    CPU there is nothing to install), then torchao."""
    return device_error(device) or torchao_error()


def _float8_api() -> Any:
    """torchao.float8, imported on first use only: a run that never asks for float8 does not
    pay for (or print) torchao's import. UnsupportedOnDevice with the install command."""
    try:
        api = importlib.import_module("torchao.float8")
        for name in ("convert_to_float8_training", "Float8LinearConfig"):
            getattr(api, name)
    except Exception as exc:  # noqa: BLE001 - any failed import (missing, wrong version) refuses
        first = (str(exc).splitlines() or [type(exc).__name__])[0]
        raise UnsupportedOnDevice(
            f"precision='float8' needs torchao 0.18, which does not import here ({first}): "
            f"{INSTALL}"
        ) from None
    return api


def is_conv1d(module: nn.Module) -> bool:
    """Whether `module` is Hugging Face's `Conv1D` (`transformers.pytorch_utils`; checked by name
    and shape, so that transformers stays optional): a linear whose weight is in x out."""
    weight = getattr(module, "weight", None)
    return (
        type(module).__name__ == "Conv1D"
        and isinstance(weight, torch.Tensor)
        and weight.dim() == 2
        and getattr(module, "nf", None) == weight.shape[1]
    )


def linear_dims(module: nn.Module) -> tuple[int, int] | None:
    """(in, out) features of an `nn.Linear` (a subclass too) or a `Conv1D`; None otherwise."""
    if isinstance(module, nn.Linear):
        return module.in_features, module.out_features
    if is_conv1d(module):
        rows, cols = _weight(module).shape
        return int(rows), int(cols)
    return None


def _weight(module: nn.Module) -> torch.Tensor:
    weight = getattr(module, "weight", None)
    assert isinstance(weight, torch.Tensor), f"{type(module).__name__} has no weight"
    return weight


def output_heads(model: nn.Module) -> set[str]:
    """The qualified names of the model's output head (see the module doc)."""
    # A converted Conv1D is an nn.Linear subclass now, and no head: its logits would be a
    # projection's (a bare GPT2Model converted, its last c_proj).
    linears = [
        (name, m)
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear) and type(m).__name__ != "Float8Conv1D"
    ]
    heads = {name for name, _ in linears[-1:]}
    heads |= {name for name, _ in linears if name.rpartition(".")[2] == "lm_head"}
    get_output = getattr(model, "get_output_embeddings", None)
    output = get_output() if callable(get_output) else None
    heads |= {name for name, m in linears if m is output}
    return heads


def keep_reason(module: nn.Module, name: str, heads: set[str]) -> str | None:
    """Why the linear `name` (an `nn.Linear` or a `Conv1D`) stays in bf16, or None when it is
    converted."""
    if type(module) is not nn.Linear and not is_conv1d(module):
        return f"{type(module).__name__} is a subclass of nn.Linear, whose forward may not run"
    if name in heads:
        return "output head: its logits feed the loss"
    dims = linear_dims(module)
    assert dims is not None  # a linear, checked above
    if dims[0] % DIVISOR or dims[1] % DIVISOR:
        return (
            f"{dims[0]} x {dims[1]}: in and out features must be "
            f"multiples of {DIVISOR} for float8 matmuls"
        )
    return None


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Float8Plan:
    """Which linears a model's conversion takes (`converted`, qualified names) and which stay in
    bf16, each with its reason (`kept`)."""

    converted: tuple[str, ...]
    kept: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, model: nn.Module) -> Float8Plan:
        heads = output_heads(model)
        converted: list[str] = []
        kept: list[tuple[str, str]] = []
        for name, module in model.named_modules():
            if linear_dims(module) is None:
                continue
            reason = keep_reason(module, name, heads)
            if reason is None:
                converted.append(name)
            else:
                kept.append((name, reason))
        return cls(converted=tuple(converted), kept=tuple(kept))

    def module_filter(self, module: nn.Module, fqn: str) -> bool:
        """torchao's `module_filter_fn`: convert exactly the planned linears."""
        return fqn in self.converted

    def report(
        self, flops: Mapping[str, int] | None, *, converted: tuple[str, ...] | None = None
    ) -> Float8Report:
        """The report of this plan: `converted` the layers really converted (None: the
        planned ones); `flops` the step's model FLOPs by module (`count_step_flops_by_linear`,
        "" the whole step), for the converted share (None: unknown)."""
        names = self.converted if converted is None else converted
        return Float8Report(
            recipe=RECIPE,
            linears=len(self.converted) + len(self.kept),
            converted=names,
            kept=self.kept,
            converted_flops=None if flops is None else sum(flops.get(n, 0) for n in names),
            step_flops=None if flops is None else flops.get(""),
        )


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Float8Report:
    """What a float8 run converted: how many of the model's linears, and the share of the step's
    model FLOPs (`trainers.flops`, forward and backward) that runs in them."""

    recipe: str
    linears: int
    converted: tuple[str, ...]
    kept: tuple[tuple[str, str], ...]
    converted_flops: int | None
    step_flops: int | None

    @property
    def flop_share(self) -> float | None:
        """converted_flops / step_flops, 0..1; None without a FLOP count."""
        if self.converted_flops is None or not self.step_flops:
            return None
        return self.converted_flops / self.step_flops

    def after_levers(self, model: nn.Module, flops: Mapping[str, int] | None) -> Float8Report:
        """This report once the levers' transforms ran on `model`, of what runs in float8 now:
        a linear a lever put back in bf16 (`float8_linears`) is counted with the kept ones, one
        a lever converted (the head, `float8_head`) with the converted ones, and the FLOP share
        (`flops` as for `Float8Plan.report`) is of those."""
        names = self.converted + tuple(n for n, _ in self.kept)
        now = {n for n in names if is_float8(model.get_submodule(n))}
        if now == set(self.converted):
            return self
        reasons = dict(self.kept)
        still = tuple(n for n in names if n in now)
        kept = tuple(
            (n, reasons.get(n, "put back in bf16 by float8_linears")) for n in names if n not in now
        )
        return dataclasses.replace(
            self,
            converted=still,
            kept=kept,
            converted_flops=None if flops is None else sum(flops.get(n, 0) for n in still),
        )

    def summary(self) -> str:
        """One line: the count, the FLOP share, and the layers kept in bf16 grouped by reason."""
        share = "" if self.flop_share is None else f", {self.flop_share:.1%} of the step's FLOPs"
        by_reason: dict[str, list[str]] = {}
        for name, why in self.kept:
            by_reason.setdefault(why, []).append(name)
        kept = "; ".join(
            f"{names[0] if len(names) == 1 else f'{len(names)} layers'} ({why})"
            for why, names in by_reason.items()
        )
        rest = f"; kept in bf16: {kept}" if kept else ""
        return (
            f"float8 ({self.recipe}): {len(self.converted)} of {self.linears} linears "
            f"converted{share}{rest}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "recipe": self.recipe,
            "linears": self.linears,
            "converted": len(self.converted),
            "converted_names": list(self.converted),
            "kept": {name: why for name, why in self.kept},
            "converted_flops": self.converted_flops,
            "step_flops": self.step_flops,
            "flop_share": self.flop_share,
            "summary": self.summary(),
        }


def convert(model: nn.Module, plan: Float8Plan) -> Undo:
    """Convert `plan.converted` in place with torchao (tensorwise); the returned `undo` puts the
    original modules back (they share their Parameters with the converted ones, so what was
    trained stays trained). torchao swaps the `nn.Linear` ones (its filter sees no other), this
    the `Conv1D` ones."""
    api = _float8_api()
    originals = {name: model.get_submodule(name) for name in plan.converted}
    config = api.Float8LinearConfig.from_recipe_name(RECIPE)
    api.convert_to_float8_training(model, config=config, module_filter_fn=plan.module_filter)
    for name, module in originals.items():
        if is_conv1d(module):
            parent, _, child = name.rpartition(".")
            setattr(
                model.get_submodule(parent) if parent else model,
                child,
                _float8_conv1d(module, config),
            )

    for name, module in originals.items():
        converted = model.get_submodule(name)
        if converted is not module:
            # Not a submodule (it would count its Parameters twice): the module it was made
            # from, for a lever that puts it back for a run (`original_of`).
            object.__setattr__(converted, ORIGINAL, module)

    def undo() -> None:
        for name, module in originals.items():
            parent, _, child = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, child, module)

    return undo


ORIGINAL = "_streamtune_original"
"""The attribute of a converted module that holds the module it was made from."""


def original_of(module: nn.Module) -> nn.Module | None:
    """The `nn.Linear` or `Conv1D` a float8 module was made from by `convert` (the very module:
    its class, hooks and Parameters, which the float8 one shares), or None."""
    found = module.__dict__.get(ORIGINAL)
    return found if isinstance(found, nn.Module) else None


def _float8_conv1d(conv: nn.Module, config: Any) -> nn.Module:
    """`conv` (a `Conv1D`) as a `Float8Conv1D` holding its very Parameters."""
    # Float8Linear.from_float wraps the weight for FSDP2's float8 all-gather; this does not, and
    # FSDP2 with float8 is refused (trainers.precision), so the recipe must not ask for it.
    assert not config.enable_fsdp_float8_all_gather, "Conv1D: no float8 all-gather"
    rows, cols = _weight(conv).shape
    with torch.device("meta"):
        converted = _float8_conv1d_class()(int(rows), int(cols), bias=False, config=config)
    converted.weight = conv.weight
    converted.bias = conv.bias
    return converted


@functools.cache
def _float8_conv1d_class() -> type[nn.Module]:
    """`Float8Conv1D`, made on first use: torchao may be absent. It subclasses torchao's
    `Float8Linear` (not a public API: the pinned torchao's, 0.18) and changes only which tensor
    its float8 matmul takes for the transposed weight: a Linear passes `weight.t()` (out x in,
    transposed), a Conv1D its weight itself (in x out). The casts, scales, three matmuls and
    the autocast handling are torchao's."""
    from torchao.float8.float8_linear import Float8Linear, matmul_with_hp_or_float8_args

    class Float8Conv1D(Float8Linear):  # type: ignore[misc,unused-ignore]
        def forward(self, input: torch.Tensor) -> torch.Tensor:
            # As Float8Linear.forward: the output in autocast's dtype, as F.linear's would be.
            if torch.is_autocast_enabled():
                input = input.to(torch.get_autocast_gpu_dtype())
            output: torch.Tensor = matmul_with_hp_or_float8_args.apply(
                input, self.weight, self.linear_mm_config, self.config
            )
            if self.bias is not None:
                output = output + self.bias.to(output.dtype)
            return output

    return Float8Conv1D


def is_float8(module: nn.Module) -> bool:
    """Whether `module` is a torchao `Float8Linear`, or a `Float8Conv1D` made from one (checked by
    name: torchao may be absent)."""
    return any(cls.__name__ == "Float8Linear" for cls in type(module).__mro__)


def apply_float8(
    model: nn.Module, *, flops: Mapping[str, int] | None, name: str = "the model"
) -> tuple[Float8Report, Undo]:
    """Convert `model`'s eligible linears (`Float8Plan.of`); the report of what was converted
    and the `undo`. `flops`: the step's model FLOPs by module (`count_step_flops_by_linear`),
    for the converted share. ConfigError naming `precision` when no linear qualifies: such a
    run would be bf16 under another name."""
    plan = Float8Plan.of(model)
    if not plan.converted:
        why = "; ".join(f"{n}: {r}" for n, r in plan.kept[:3]) or "it has no nn.Linear"
        raise ConfigError(
            "precision",
            "float8",
            f"a model with an nn.Linear or Conv1D that float8 can convert (in and out features "
            f"multiples of {DIVISOR}, not the output head); {name} has none ({why})",
        )
    undo = convert(model, plan)
    # What torchao really swapped, not what was asked: the report must not claim a layer that
    # its own rules skipped.
    converted = tuple(n for n, m in model.named_modules() if is_float8(m))
    return plan.report(flops, converted=converted), undo
