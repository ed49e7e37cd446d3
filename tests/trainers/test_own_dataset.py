"""examples/own_dataset.py on real files: a folder of PNGs and a text file made in tmp_path, read
through a DataLoader with the example's collate_fn and trained a few steps on the CPU."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from examples.own_dataset import (
    IMAGE_DIR,
    TEXT_FILE,
    ImageFolder,
    TokenWindows,
    collate_windows,
    image_folder,
    text_file,
)
from trainers import LoopConfig, RunArgs, WorkloadError, load_workload, run

SENTENCE = "the cat sat on the mat and the dog sat on the log while the bird sang"
WORDS = SENTENCE.split()


@pytest.fixture
def png_folder(tmp_path: Path) -> Path:
    """Two classes of 6 PNGs each, of several sizes: reddish and bluish noise."""
    image_module = pytest.importorskip("PIL.Image")
    generator = torch.Generator().manual_seed(0)
    for label, (name, channel) in enumerate([("red", 0), ("blue", 2)]):
        (tmp_path / name).mkdir()
        for i in range(6):
            height, width = 20 + i, 24
            pixels = torch.randint(0, 100, (height, width, 3), generator=generator)
            pixels[..., channel] += 150
            image = image_module.fromarray(pixels.to(torch.uint8).numpy())
            image.save(tmp_path / name / f"{label}_{i:02d}.png")
    return tmp_path


@pytest.fixture
def text_path(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    lines = [" ".join(WORDS[i:] + WORDS[:i]) for i in range(len(WORDS))]
    path.write_text("\n".join(lines * 3), encoding="utf-8")
    return path


@pytest.mark.models  # PIL comes with the models extra
def test_image_folder_reads_pngs_in_sorted_order(png_folder: Path) -> None:
    dataset = ImageFolder(png_folder, 16)
    assert len(dataset) == 12 and dataset.classes == ["blue", "red"]
    image, label = dataset[0]
    assert image.shape == (3, 16, 16) and image.dtype == torch.uint8 and label == 0
    assert dataset[11][1] == 1
    assert image[2].float().mean() > image[0].float().mean()  # blue


@pytest.mark.models  # PIL comes with the models extra
def test_image_folder_trains_with_the_collate_fn_in_workers(png_folder: Path) -> None:
    build = image_folder(png_folder)
    workload = build("tiny", seed=0)
    assert workload.batch_size == 4 and workload.samples_per_batch == 4
    assert workload.collate_fn is not None
    images, labels = workload.collate_fn([workload.dataset[i] for i in range(4)])
    assert images.shape == (4, 3, 16, 16) and images.dtype == torch.float32
    assert labels.dtype == torch.int64
    assert float(images.min()) >= -1.0 and float(images.max()) <= 1.0

    result = run(workload, LoopConfig(), RunArgs(steps=9, warmup=0, windows=1, device="cpu"))
    assert all(math.isfinite(loss) for loss in result.losses)
    assert len(set(result.losses)) > 1
    # Collated in two worker processes: the same batches, so the same losses.
    in_workers = run(
        build("tiny", seed=0),
        LoopConfig(num_workers=2),
        RunArgs(steps=9, warmup=0, windows=1, device="cpu"),
    )
    assert in_workers.losses == result.losses


@pytest.mark.models  # PIL comes with the models extra
def test_images_by_name_from_the_environment(
    png_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(IMAGE_DIR, str(png_folder))
    workload = load_workload("examples.own_dataset:build_images", "tiny", seed=3)
    again = load_workload("examples.own_dataset:build_images", "tiny", seed=3)
    for a, b in zip(workload.model.parameters(), again.model.parameters(), strict=True):
        assert torch.equal(a, b)
    run(workload, LoopConfig(), RunArgs(steps=3, warmup=0, windows=1, device="cpu"))


def test_token_windows_are_sequences_and_their_next_tokens(text_path: Path) -> None:
    dataset = TokenWindows(text_path, seq=16, vocab=8)
    words = text_path.read_text(encoding="utf-8").split()
    assert len(dataset) == (len(words) - 1) // 16
    window = dataset[0]
    assert window.shape == (17,) and window.dtype == torch.int64
    assert int(window.max()) < 8
    assert int(window[0]) == 1  # "the", the most frequent word, has the first id
    assert torch.equal(dataset[1][0], dataset[0][-1])  # windows overlap by one token
    inputs, targets = collate_windows([dataset[0], dataset[1]])
    assert inputs.shape == targets.shape == (2, 16)
    assert torch.equal(inputs[:, 1:], targets[:, :-1])


def test_text_file_trains_and_its_loss_falls(text_path: Path) -> None:
    workload = text_file(text_path)("tiny", seed=0)
    assert workload.tokens_per_sample == 16 and workload.batch_size == 4
    result = run(workload, LoopConfig(), RunArgs(steps=30, warmup=0, windows=1, device="cpu"))
    assert all(math.isfinite(loss) for loss in result.losses)
    assert sum(result.losses[-5:]) < sum(result.losses[:5])
    again = run(
        text_file(text_path)("tiny", seed=0),
        LoopConfig(),
        RunArgs(steps=30, warmup=0, windows=1, device="cpu"),
    )
    assert again.losses == result.losses


def test_missing_data_is_a_workload_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TEXT_FILE, raising=False)
    with pytest.raises(WorkloadError, match=f"set {TEXT_FILE} to a text file"):
        load_workload("examples.own_dataset:build_text", "tiny")
    short = tmp_path / "short.txt"
    short.write_text("too few words here", encoding="utf-8")
    with pytest.raises(WorkloadError, match="holds 0 samples, fewer than one batch of 4"):
        text_file(short)("tiny", seed=0)
    with pytest.raises(WorkloadError, match="preset='huge' is invalid"):
        text_file(short)("huge", seed=0)
