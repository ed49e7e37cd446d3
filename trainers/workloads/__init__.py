"""Reference workloads and the loader for users' own (`package.module:factory`)."""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from trainers.errors import WorkloadError
from trainers.workloads import convnet, mlp, transformer
from trainers.workloads.base import (
    Batch,
    SyntheticBatches,
    Workload,
    WorkloadFactory,
    adam,
    disable_dropout,
)

BUILTIN: Mapping[str, WorkloadFactory] = {
    "transformer": transformer.build,
    "mlp": mlp.build,
    "convnet": convnet.build,
}

PRESETS: Mapping[str, tuple[str, ...]] = {
    "transformer": tuple(transformer.PRESETS),
    "mlp": tuple(mlp.PRESETS),
    "convnet": tuple(convnet.PRESETS),
}


def resolve_factory(name: str) -> WorkloadFactory:
    """A built-in name, or `package.module:factory` for a user's own workload."""
    if name in BUILTIN:
        return BUILTIN[name]
    if ":" not in name:
        raise WorkloadError(
            f"workload={name!r} is invalid: allowed {', '.join(BUILTIN)} "
            "or package.module:factory",
            field="workload",
        )
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise WorkloadError(
            f"workload={name!r}: cannot import {module_name!r}: {exc}", field="workload"
        ) from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise WorkloadError(
            f"workload={name!r}: {module_name!r} has no callable {attr!r}", field="workload"
        )
    return factory


def load_workload(name: str, preset: str, *, seed: int = 0) -> Workload:
    """Build a fresh workload (new model, same data) for `name` and `preset` from `seed`."""
    factory = resolve_factory(name)
    try:
        workload = factory(preset, seed=seed)
    except WorkloadError:
        raise
    except ValueError as exc:  # a user factory refusing its preset
        raise WorkloadError(f"workload={name!r}: {exc}", field="preset") from exc
    if not isinstance(workload, Workload):
        raise WorkloadError(
            f"workload={name!r}: the factory returned {type(workload).__name__}, not a Workload",
            field="workload",
        )
    return workload


__all__ = [
    "BUILTIN",
    "PRESETS",
    "Batch",
    "SyntheticBatches",
    "Workload",
    "WorkloadFactory",
    "adam",
    "disable_dropout",
    "load_workload",
    "resolve_factory",
]
