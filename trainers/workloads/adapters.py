"""Library models by name: `torchvision:<model>`, `timm:<model>` and `hf:<kind>`.

A name with one of these prefixes is always a library model, never `package.module:factory`
(`torchvision:resnet18` reads as both). Its `--model-arg` options are parsed when the name is
resolved and bound into a `BoundFactory`, which is called like every workload factory,
`factory(preset, *, seed)`, so nothing downstream (the loop, parity, the tuner) knows the options
exist.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Protocol

from trainers.errors import WorkloadError
from trainers.workloads import text, vision
from trainers.workloads.base import Workload
from trainers.workloads.options import Family, Value


class Builder(Protocol):
    def __call__(
        self, *, name: str, model: str, preset: str, options: Mapping[str, Value], seed: int
    ) -> Workload: ...


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class Adapter:
    """A family and how to build it. `check_model(name, model)` imports the library and refuses
    a model it does not know, at resolve time, before any preset or seed is chosen."""

    family: Family
    check_model: Callable[[str, str], None]
    build: Builder


TORCHVISION = Adapter(
    family=vision.TORCHVISION, check_model=vision.check_torchvision, build=vision.build_torchvision
)
TIMM = Adapter(family=vision.TIMM, check_model=vision.check_timm, build=vision.build_timm)
HF: Mapping[str, Adapter] = {
    kind: Adapter(family=family, check_model=text.check_transformers, build=text.build)
    for kind, family in text.FAMILIES.items()
}
PREFIXES = ("torchvision", "timm", "hf")


def catalog() -> tuple[Family, ...]:
    """Every family, its presets and options, for listing; imports none of the libraries."""
    return (TORCHVISION.family, TIMM.family, *(adapter.family for adapter in HF.values()))


def lookup(name: str) -> tuple[Adapter, str] | None:
    """The adapter and model of a library name; None for any other name."""
    prefix, colon, model = name.partition(":")
    if not colon or prefix not in PREFIXES:
        return None
    if prefix == "hf":
        if model not in HF:
            raise WorkloadError(
                f"workload={name!r} is invalid: allowed " + ", ".join(f"hf:{kind}" for kind in HF),
                field="workload",
            )
        return HF[model], model
    adapter = TORCHVISION if prefix == "torchvision" else TIMM
    if not model:
        raise WorkloadError(
            f"workload={name!r} names no model: allowed {adapter.family.usage}", field="workload"
        )
    return adapter, model


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class BoundFactory:
    """A library model with the user's options bound: a `WorkloadFactory` like any other."""

    name: str
    model: str
    adapter: Adapter
    overrides: Mapping[str, Value]

    def options(self, preset: str) -> dict[str, Value]:
        """The effective options under `preset` (WorkloadError for an unknown preset)."""
        return self.adapter.family.resolve(preset, self.overrides)

    def __call__(self, preset: str, *, seed: int) -> Workload:
        return self.adapter.build(
            name=self.name, model=self.model, preset=preset, options=self.options(preset), seed=seed
        )


def bind(
    name: str, model_args: Mapping[str, str], *, check_model: bool = True
) -> BoundFactory | None:
    """The factory for a library name with its options parsed; None for any other name.

    check_model: import the library and check the model's name now (False for naming only,
    as `workload_key` does, which must not import a library).
    """
    found = lookup(name)
    if found is None:
        return None
    adapter, model = found
    overrides = adapter.family.parse(model_args)
    if check_model:
        adapter.check_model(name, model)
    return BoundFactory(name=name, model=model, adapter=adapter, overrides=overrides)
