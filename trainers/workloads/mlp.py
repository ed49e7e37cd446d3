"""A multi-layer perceptron classifying Gaussian inputs labelled by a fixed random teacher."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from trainers.workloads.base import Batch, SyntheticBatches, Workload, adam, check_preset


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class MLPShape:
    features: int
    hidden: int
    depth: int
    classes: int
    batch: int
    dropout: float = 0.1
    n_batches: int = 32


PRESETS: dict[str, MLPShape] = {
    "tiny": MLPShape(features=32, hidden=64, depth=2, classes=10, batch=16),
    "small": MLPShape(features=512, hidden=1024, depth=4, classes=100, batch=256),
    "large": MLPShape(features=1024, hidden=4096, depth=8, classes=1000, batch=1024, n_batches=16),
}


def make_model(shape: MLPShape) -> nn.Sequential:
    layers: list[nn.Module] = []
    width = shape.features
    for _ in range(shape.depth):
        layers += [nn.Linear(width, shape.hidden), nn.GELU(), nn.Dropout(shape.dropout)]
        width = shape.hidden
    layers.append(nn.Linear(width, shape.classes))
    return nn.Sequential(*layers)


def teacher_data(shape: MLPShape, generator: torch.Generator) -> Batch:
    x = torch.randn(shape.n_batches, shape.batch, shape.features, generator=generator)
    teacher = torch.randn(shape.features, shape.classes, generator=generator)
    return x, (x @ teacher).argmax(dim=-1)


def classification_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


def build(preset: str, *, seed: int) -> Workload:
    check_preset("mlp", preset, PRESETS)
    shape = PRESETS[preset]
    torch.manual_seed(seed)
    model = make_model(shape)
    generator = torch.Generator().manual_seed(seed + 1)
    return Workload(
        name="mlp",
        preset=preset,
        model=model,
        dataset=SyntheticBatches(teacher_data(shape, generator)),
        loss_fn=classification_loss,
        samples_per_batch=shape.batch,
        make_optimizer=adam(1e-3),
    )
