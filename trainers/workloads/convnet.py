"""A small ResNet-style network on synthetic images whose class is a fixed pattern plus noise."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from trainers.workloads.base import SyntheticBatches, Workload, adam, check_preset
from trainers.workloads.mlp import classification_loss


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class ConvShape:
    image: int
    widths: tuple[int, ...]
    blocks_per_stage: int
    classes: int
    batch: int
    n_batches: int = 16


PRESETS: dict[str, ConvShape] = {
    "tiny": ConvShape(image=8, widths=(8, 16), blocks_per_stage=1, classes=10, batch=8),
    "small": ConvShape(image=32, widths=(32, 64, 128), blocks_per_stage=1, classes=10, batch=128),
    "large": ConvShape(
        image=64,
        widths=(64, 128, 256, 512),
        blocks_per_stage=2,
        classes=100,
        batch=128,
        n_batches=8,
    ),
}


class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.shortcut = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride=stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


class GlobalAveragePool(nn.Module):
    """Mean over height and width. Unlike AdaptiveAvgPool2d, its CUDA backward is deterministic,
    which check_parity needs for bit-exact comparisons."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=(2, 3))


def make_model(shape: ConvShape) -> nn.Sequential:
    layers: list[nn.Module] = [
        nn.Conv2d(3, shape.widths[0], 3, padding=1, bias=False),
        nn.BatchNorm2d(shape.widths[0]),
        nn.ReLU(),
    ]
    c_in = shape.widths[0]
    for stage, width in enumerate(shape.widths):
        for block in range(shape.blocks_per_stage):
            stride = 2 if stage > 0 and block == 0 else 1
            layers.append(BasicBlock(c_in, width, stride))
            c_in = width
    layers += [GlobalAveragePool(), nn.Linear(c_in, shape.classes)]
    return nn.Sequential(*layers)


def pattern_images(shape: ConvShape, generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    patterns = torch.randn(shape.classes, 3, shape.image, shape.image, generator=generator)
    labels = torch.randint(0, shape.classes, (shape.n_batches, shape.batch), generator=generator)
    noise = torch.randn(
        shape.n_batches, shape.batch, 3, shape.image, shape.image, generator=generator
    )
    return patterns[labels] + noise, labels


def build(preset: str, *, seed: int) -> Workload:
    check_preset("convnet", preset, PRESETS)
    shape = PRESETS[preset]
    torch.manual_seed(seed)
    model = make_model(shape)
    generator = torch.Generator().manual_seed(seed + 1)
    return Workload(
        name="convnet",
        preset=preset,
        model=model,
        dataset=SyntheticBatches(pattern_images(shape, generator)),
        loss_fn=classification_loss,
        samples_per_batch=shape.batch,
        make_optimizer=adam(1e-3),
    )
