"""`trainers.Trainer` on the library models (torchvision, timm, Hugging Face) on the CPU: a run
cut by a checkpoint and resumed gives the uninterrupted run's losses bit for bit, with a
warm-up + cosine schedule, clipping, 2 micro-batches and evaluation on held-out batches (the
vision models' BatchNorm switches to eval mode and back)."""

from __future__ import annotations

from pathlib import Path

import pytest

import trainers
from trainers import LoopConfig, Trainer, fit

pytestmark = pytest.mark.models

CASES = [
    ("torchvision:resnet18", "torchvision", {}),
    ("timm:resnet10t", "timm", {}),
    ("hf:causal-lm", "transformers", {"lr": "1e-3"}),
    ("hf:causal-lm", "transformers", {"arch": "llama", "attention": "eager", "lr": "1e-3"}),
    ("hf:masked-lm", "transformers", {"lr": "1e-3"}),
]


warmup_cosine = fit.warmup_cosine(8, 2, start_factor=0.1)


@pytest.mark.parametrize(
    ("name", "library", "args"),
    CASES,
    ids=[f"{name}-{args.get('arch', '')}".rstrip("-") for name, _, args in CASES],
)
def test_a_library_model_resumes_bit_for_bit(
    name: str, library: str, args: dict[str, str], tmp_path: Path
) -> None:
    pytest.importorskip(library)

    def make() -> trainers.Workload:
        return trainers.load_workload(name, "tiny", seed=0, model_args=args)

    held_out = [trainers.load_workload(name, "tiny", seed=1, model_args=args).dataset[0]]
    options = dict(
        config=LoopConfig(num_streams=2, sync_mode="event", sync_interval=3),
        device="cpu",
        scheduler=warmup_cosine,
        clip_grad_norm=1.0,
        accumulate=2,
        eval_data=held_out,
    )
    whole = Trainer(make(), **options).fit(8, eval_every=4)
    Trainer(make(), **options).fit(
        4, eval_every=4, checkpoint_every=4, checkpoint_path=tmp_path / "c"
    )
    resumed = Trainer(make(), **options).fit(8, eval_every=4, resume_from=tmp_path / "c")
    assert resumed.losses == whole.losses[4:]
    assert resumed.evals == whole.evals[1:]
    assert len(set(whole.losses)) > 4
