"""What `benchmarks/gate_power.py` judges: the models (`ModelSpec`, parsed from
`name[@preset][+key=value]...`) and the configs the gate must pass (`EQUIVALENT`), with the
evidence plan's choices of both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import torch

from trainers import PRECISIONS, LoopConfig, Precision, resolve_factory
from trainers.gate import FAULTS, FaultKind, GateTest
from trainers.workloads import WorkloadFactory, lookup

CUDA_MODELS = (
    "transformer@small,convnet@small,mlp@small,torchvision:resnet18,hf:causal-lm,"
    "hf:masked-lm,timm:resnet10t"
)
CPU_MODELS = "mlp,transformer,convnet"

EVIDENCE_MODELS = (
    "transformer@tiny,hf:masked-lm@tiny,hf:causal-lm@tiny+arch=llama+precision=bf16-autocast,"
    "hf:causal-lm@tiny,timm:resnet10t@tiny"
)
EVIDENCE_FAULT_MODELS = "transformer@small,convnet@small"
EVIDENCE_CONFIGS = "graph,2-stream-event"
"""The configs the evidence asks of every model: the eager whole-step graph (exact against its
twin, where the probe says bits can match) and a loop-only config (exact against the
reference). Arithmetic changes (fused, foreach optimizers) are left out to fit 7 minutes."""
EVIDENCE_PROBE_PRECISIONS = "fp32,bf16-autocast"
"""Probed besides each model's own precision (the process default, as fp32, for all but the
bf16 Llama)."""


@dataclasses.dataclass(kw_only=True, frozen=True)
class Equivalent:
    """A config the gate must pass; `test` forces a test (None: the config's own)."""

    name: str
    config: LoopConfig
    cuda_only: bool
    test: GateTest | None = None
    control_of: FaultKind | None = None


_DEFERRED = LoopConfig(sync_interval=10, sync_mode="event", pin_memory=True, non_blocking=True)
EQUIVALENT: tuple[Equivalent, ...] = (
    Equivalent(name="graph", config=_DEFERRED.replace(cuda_graph=True), cuda_only=True),
    Equivalent(
        name="2-stream-event",
        config=_DEFERRED.replace(num_streams=2, prefetch_depth=1),
        cuda_only=False,
    ),
    Equivalent(name="foreach-optimizer", config=LoopConfig(optimizer="foreach"), cuda_only=False),
    Equivalent(name="fused-optimizer", config=LoopConfig(optimizer="fused"), cuda_only=False),
    Equivalent(
        name="graph+fused",
        config=_DEFERRED.replace(cuda_graph=True, optimizer="fused"),
        cuda_only=True,
    ),
    *(
        Equivalent(
            name=f"control:{fault.kind}",
            config=fault.config,
            cuda_only=True,
            test=fault.test,
            control_of=fault.kind,
        )
        for fault in FAULTS.values()
        if fault.provocation
    ),
)


@dataclasses.dataclass(kw_only=True, frozen=True)
class ModelSpec:
    """One model of the benchmark: its label in the results, what builds it, its precision."""

    label: str
    name: str
    preset: str
    model_args: dict[str, str]
    precision: Precision | None


def parse_models(
    spec: str,
    device: torch.device,
    *,
    precision: Precision | None = None,
    model_args: Mapping[str, str] | None = None,
) -> list[ModelSpec]:
    """`name[@preset][+key=value]...,...` -> the models (see the module docstring)."""
    default_preset = "small" if device.type == "cuda" else "tiny"
    models = []
    for item in (s.strip() for s in spec.split(",")):
        if not item:
            continue
        head, *options = item.split("+")
        name, _, preset = head.partition("@")
        preset = preset or default_preset
        own = dict(parse_model_args(options))
        chosen = own.pop("precision", precision)
        if chosen is not None and chosen not in PRECISIONS:
            raise SystemExit(f"--models {item!r}: precision={chosen!r}; allowed {PRECISIONS}")
        label = "+".join([f"{name}@{preset}", *options])
        models.append(
            ModelSpec(
                label=label,
                name=name,
                preset=preset,
                model_args={**(model_args or {}), **own},
                precision=chosen,  # type: ignore[arg-type]
            )
        )
    return models


def load(spec: ModelSpec) -> WorkloadFactory | str:
    """The model's factory (its options bound for a library model), or why it cannot be built."""
    try:
        library = lookup(spec.name) is not None
        factory = resolve_factory(spec.name, spec.model_args if library else None)
        workload = factory(spec.preset, seed=0)
    except Exception as exc:  # noqa: BLE001 - any failure to build skips the model, with its reason
        return f"{type(exc).__name__}: {exc}"
    del workload
    return factory


def parse_model_args(items: Sequence[str]) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, equals, value = item.partition("=")
        if not equals:
            raise SystemExit(f"--model-arg {item!r}: expected key=value")
        pairs[key] = value
    return pairs
