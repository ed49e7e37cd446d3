"""A user's factory built from its seed: the global generators seeded before it runs, and a
second build from the same seed that gives other weights refused, naming the seed.

The contract is `factory(preset, *, seed)`: the same seed, the same model. The gate holds every
config to it: a loop setting is checked against the reference bit for bit from the same
initial weights (`trainers.gate.exact`), its spread measured across seeds (`envelope`). A
factory that drew its weights without reading `seed` built other weights at each build (the
generators had moved on since the last), so two runs of one config differed from the first
step: the reproducibility probe then called the arithmetic not reproducible and skipped every
exact test, a fault's effect hidden among the factory's own draws, and nothing told the user.

So `torch`'s, `random`'s and NumPy's global generators are seeded with `seed` before the
factory runs (a factory that draws from them, as most do, keeps the contract without a line
of its own), and the weights of the first build from each (factory, preset, seed) are sampled
(`SAMPLED` values of each parameter) and compared with each later build's: a factory that
draws from a generator of its own, unseeded, is refused in one line.
"""

from __future__ import annotations

import random
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from trainers.errors import WorkloadError

SAMPLED = 64
"""Values of each parameter kept from a first build: enough to tell fresh random weights apart,
few enough to keep for every (workload, preset, seed) a process builds."""

_FIRST: weakref.WeakKeyDictionary[Callable[..., Any], dict[tuple[str, int], list[torch.Tensor]]]
_FIRST = weakref.WeakKeyDictionary()
"""Per factory function (a module imported again, its code changed, gives another), the sampled
weights of its first build from each (preset, seed)."""


def seed_generators(seed: int) -> None:
    """Seed torch's (every device's), `random`'s and NumPy's global generators with `seed`."""
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy as np
    except ImportError:  # torch runs without NumPy
        return
    np.random.seed(seed % 2**32)


def check_seeded(
    factory: Callable[..., Any], name: str, preset: str, seed: int, model: nn.Module
) -> None:
    """WorkloadError where `model`, built by `factory` (the workload `name`) from `seed`, has
    other weights than its first build of (`preset`, `seed`) in this process."""
    sample = list(_sampled(model))
    try:
        builds = _FIRST.setdefault(factory, {})
    except TypeError:  # not weakly referable (a callable object with __slots__): not checked
        return
    first = builds.setdefault((preset, seed), sample)
    if first is sample:
        return
    same = len(first) == len(sample) and all(
        a.shape == b.shape and torch.equal(a, b) for a, b in zip(first, sample, strict=True)
    )
    if not same:
        raise WorkloadError(
            f"workload={name!r}: factory(preset={preset!r}, seed={seed}) built other weights "
            "than its first build from that seed, so runs of one config differ from the first "
            "step and the gate cannot check them: build a new model at each call, drawing from "
            "torch's, random's or NumPy's global generators (seeded before the factory runs) or "
            "from one made with `seed`, not from an unseeded one or a model kept between calls",
            field="workload",
            every_config=True,
        )


def _sampled(model: nn.Module) -> Iterator[torch.Tensor]:
    with torch.no_grad():
        for param in model.parameters():
            if isinstance(param, nn.parameter.UninitializedParameter):
                continue  # a lazy module's, sized at its first forward
            if param.device.type == "meta" or param.numel() == 0:
                continue  # no values yet (built later, on the device)
            flat = param.detach().reshape(-1)[:SAMPLED]
            yield flat.to("cpu", torch.float32, copy=True)
