"""Your own data as a workload: any map-style Dataset plus a collate_fn, batched by the DataLoader.

    export STREAMTUNE_IMAGE_DIR=data/train  # data/train/<class>/<name>.png
    python -m tuner train --workload examples.own_dataset:build_images
    export STREAMTUNE_TEXT_FILE=corpus.txt
    python -m tuner train --workload examples.own_dataset:build_text

`dataset_workload` is the whole recipe; two datasets show it at work: a folder of PNG images, one
subfolder per class (torchvision's ImageFolder layout), and a text file cut into fixed-length
windows of word ids. Unlike the built-ins, which serve whole synthetic batches, these workloads set
`batch_size`, so `dataset[i]` is one sample and the DataLoader batches samples with `collate_fn`,
in its worker processes when `num_workers > 0`: decoding and batching then cost what they cost
in real training, and the tuner measures them.

A factory takes only the preset and a seed, so the data's location comes from the environment
(`build_images`, `build_text`), or bind it yourself: `build = image_folder(Path("data/train"))`.
The same preset and seed give the same weights and the same batches: the files are read in sorted
order and never shuffled.
"""

from __future__ import annotations

import collections
import dataclasses
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from trainers import Workload, WorkloadError
from trainers.workloads import WorkloadFactory, adamw, check_preset

Batch = tuple[torch.Tensor, ...]
IMAGE_DIR, TEXT_FILE = "STREAMTUNE_IMAGE_DIR", "STREAMTUNE_TEXT_FILE"
UNKNOWN = 0  # the id of every word outside the vocabulary
Sample = TypeVar("Sample")


def dataset_workload(
    name: str,
    preset: str,
    *,
    dataset: Dataset[Sample],
    collate_fn: Callable[[list[Sample]], Batch],
    model: nn.Module,
    loss_fn: Callable[[nn.Module, Batch], torch.Tensor],
    batch: int,
    tokens_per_sample: int | None = None,
    lr: float = 1e-3,
) -> Workload:
    """Any map-style dataset as a workload, `batch` samples a step, collated by `collate_fn`.

    `collate_fn` gets a list of `dataset[i]` and returns the batch as a tuple of tensors, the
    order `loss_fn(model, batch)` reads them in. The loader drops a last partial batch (every
    step has the same shape, as CUDA graphs need), so the dataset must hold at least one batch.
    """
    size = len(dataset)  # type: ignore[arg-type]
    if size < batch:
        raise WorkloadError(
            f"workload {name!r}: the dataset holds {size} samples, fewer than one batch of {batch}",
            field="workload",
        )
    return Workload(
        name=name,
        preset=preset,
        model=model,
        dataset=dataset,  # type: ignore[arg-type]  # samples, not batches: batch_size is set
        loss_fn=loss_fn,
        samples_per_batch=batch,
        batch_size=batch,
        collate_fn=collate_fn,
        tokens_per_sample=tokens_per_sample,
        make_optimizer=adamw(lr),
    )


# -- a folder of PNG images -------------------------------------------------------------------


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class ImageShape:
    batch: int
    image: int  # every image is resized to image x image


IMAGE_PRESETS = {"tiny": ImageShape(batch=4, image=16), "small": ImageShape(batch=64, image=64)}


class ImageFolder(Dataset[tuple[torch.Tensor, int]]):
    """`root/<class>/<name>.png`, classes and files in sorted order. A sample is the decoded
    image as uint8 CHW (the collate function makes floats of a whole batch at once) and its
    class index."""

    def __init__(self, root: Path, size: int) -> None:
        self.files = sorted(root.glob("*/*.png"))
        self.classes = sorted({path.parent.name for path in self.files})
        self.labels = {name: label for label, name in enumerate(self.classes)}
        self.size = size
        if len(self.classes) < 2:
            raise WorkloadError(
                f"{root} holds PNG files in {len(self.classes)} class folder(s): allowed a "
                "folder of at least two class folders, root/<class>/<name>.png",
                field="workload",
            )

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        from PIL import Image  # Pillow comes with torchvision: imported where images are read

        path = self.files[index]
        with Image.open(path) as image:
            pixels = np.asarray(image.convert("RGB").resize((self.size, self.size)))
        return torch.from_numpy(pixels.copy()).permute(2, 0, 1), self.labels[path.parent.name]


def collate_images(samples: Sequence[tuple[torch.Tensor, int]]) -> Batch:
    """uint8 images to float32 in about [-1, 1], and int64 labels."""
    images = torch.stack([image for image, _ in samples]).float().div_(127.5).sub_(1.0)
    return images, torch.tensor([label for _, label in samples], dtype=torch.int64)


def image_model(classes: int, width: int = 32) -> nn.Sequential:
    def block(c_in: int, c_out: int) -> list[nn.Module]:
        return [
            nn.Conv2d(c_in, c_out, 3, stride=2, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(),
        ]

    return nn.Sequential(
        *block(3, width),
        *block(width, 2 * width),
        nn.Flatten(2),
        MeanOverLast(),
        nn.Linear(2 * width, classes),
    )


class MeanOverLast(nn.Module):
    """Global average pooling of the flattened pixels (deterministic on CUDA, which
    AdaptiveAvgPool2d's backward is not)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.mean(dim=-1)


def classify_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(images), labels)


def image_folder(root: Path) -> WorkloadFactory:
    """A factory for the PNG folder `root` (bind it in a module of yours to tune it)."""

    def build(preset: str, *, seed: int) -> Workload:
        check_preset("own_dataset.images", preset, IMAGE_PRESETS)
        shape = IMAGE_PRESETS[preset]
        dataset = ImageFolder(root, shape.image)
        torch.manual_seed(seed)
        return dataset_workload(
            "own_dataset.images",
            preset,
            dataset=dataset,
            collate_fn=collate_images,
            model=image_model(len(dataset.classes)),
            loss_fn=classify_loss,
            batch=shape.batch,
        )

    return build


# -- a text file, as windows of word ids -------------------------------------------------------


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class TextShape:
    batch: int
    seq: int
    vocab: int
    width: int


TEXT_PRESETS = {
    "tiny": TextShape(batch=4, seq=16, vocab=64, width=32),
    "small": TextShape(batch=32, seq=128, vocab=8192, width=256),
}


class TokenWindows(Dataset[torch.Tensor]):
    """A text file's words (split on whitespace) as ids, cut into windows of `seq + 1` ids that
    overlap by one, so a window is a sequence and its next tokens. The `vocab - 1` most frequent
    words get ids 1..vocab-1 (ties in alphabetical order); any other word is UNKNOWN."""

    def __init__(self, path: Path, seq: int, vocab: int) -> None:
        words = path.read_text(encoding="utf-8").split()
        counts = collections.Counter(words)
        ranked = sorted(counts, key=lambda word: (-counts[word], word))[: vocab - 1]
        ids = {word: i + 1 for i, word in enumerate(ranked)}
        tokens = torch.tensor([ids.get(word, UNKNOWN) for word in words], dtype=torch.int64)
        count = (len(tokens) - 1) // seq
        self.windows = (
            tokens[: count * seq + 1].unfold(0, seq + 1, seq)
            if count > 0
            else tokens.new_empty(0, seq + 1)
        )

    def __len__(self) -> int:
        return int(self.windows.shape[0])

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.windows[index]


def collate_windows(samples: Sequence[torch.Tensor]) -> Batch:
    """(inputs, targets): the targets are the inputs shifted by one token."""
    windows = torch.stack(list(samples))
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


class TinyLM(nn.Module):
    """One causal transformer layer over word embeddings: a small next-word model."""

    def __init__(self, shape: TextShape) -> None:
        super().__init__()
        self.embed = nn.Embedding(shape.vocab, shape.width)
        self.position = nn.Embedding(shape.seq, shape.width)
        self.layer = nn.TransformerEncoderLayer(
            shape.width, nhead=4, dim_feedforward=4 * shape.width, batch_first=True, norm_first=True
        )
        self.head = nn.Linear(shape.width, shape.vocab)
        # A buffer, so it moves with the model and keeps one address (CUDA graphs need that).
        causal = nn.Transformer.generate_square_subsequent_mask(shape.seq)
        self.register_buffer("causal_mask", causal, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) + self.position.weight[: ids.shape[1]]
        # is_causal said explicitly: otherwise the mask is compared with a causal one on the host.
        return self.head(self.layer(x, src_mask=self.causal_mask, is_causal=True))


def next_word_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    inputs, targets = batch
    return F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())


def text_file(path: Path) -> WorkloadFactory:
    """A factory for the text file `path` (bind it in a module of yours to tune it)."""

    def build(preset: str, *, seed: int) -> Workload:
        check_preset("own_dataset.text", preset, TEXT_PRESETS)
        shape = TEXT_PRESETS[preset]
        torch.manual_seed(seed)
        return dataset_workload(
            "own_dataset.text",
            preset,
            dataset=TokenWindows(path, shape.seq, shape.vocab),
            collate_fn=collate_windows,
            model=TinyLM(shape),
            loss_fn=next_word_loss,
            batch=shape.batch,
            tokens_per_sample=shape.seq,
        )

    return build


# -- the factories the tuner names ------------------------------------------------------------


def from_environment(variable: str, what: str) -> Path:
    value = os.environ.get(variable)
    if not value:
        raise WorkloadError(f"set {variable} to {what}", field="workload")
    return Path(value)


def build_images(preset: str, *, seed: int) -> Workload:
    root = from_environment(IMAGE_DIR, "a folder of <class>/<name>.png images")
    return image_folder(root)(preset, seed=seed)


def build_text(preset: str, *, seed: int) -> Workload:
    return text_file(from_environment(TEXT_FILE, "a text file"))(preset, seed=seed)
