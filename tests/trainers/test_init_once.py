"""`trainers.workloads.init_once.built_once`: a linear's first random draw is skipped only where
the model's own init writes that weight again; otherwise the model is made as before."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

from trainers import load_workload
from trainers.workloads.init_once import built_once


class OwnInit(nn.Module):
    """Writes its linears again after making them, as transformers' `post_init` does."""

    def __init__(self, keep_last: bool = False) -> None:
        super().__init__()
        self.first = nn.Linear(8, 16, bias=False)
        self.last = nn.Linear(16, 4, bias=False)
        nn.init.normal_(self.first.weight, std=0.02)
        if not keep_last:
            nn.init.normal_(self.last.weight, std=0.02)


def test_a_weight_written_again_is_drawn_once() -> None:
    torch.manual_seed(3)
    model = built_once(OwnInit)
    after = torch.get_rng_state()
    # What the model's own init alone draws, in its order: nothing for the skipped draws.
    torch.manual_seed(3)
    first = torch.empty(16, 8).normal_(std=0.02)
    last = torch.empty(4, 16).normal_(std=0.02)
    assert torch.equal(model.first.weight, first) and torch.equal(model.last.weight, last)
    assert torch.equal(after, torch.get_rng_state())


@pytest.mark.parametrize("make", [lambda: OwnInit(keep_last=True), lambda: nn.Linear(8, 4)])
def test_a_weight_left_to_torchs_init_makes_the_model_again_as_before(make) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(5)
    model = built_once(make)
    after = torch.get_rng_state()
    torch.manual_seed(5)
    plain = make()
    for (name, got), want in zip(
        model.state_dict().items(), plain.state_dict().values(), strict=True
    ):
        assert torch.equal(got, want), name
    assert torch.equal(after, torch.get_rng_state())


def test_another_thread_draws_as_usual_meanwhile() -> None:
    """The mode is this thread's: a linear made on another thread while it is on keeps its
    kaiming draw (not NaN)."""
    made: list[nn.Linear] = []

    def other() -> None:
        made.append(nn.Linear(64, 64))

    def make() -> OwnInit:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        return OwnInit()

    built_once(make)
    assert torch.isfinite(made[0].weight).all()
    assert made[0].weight.abs().max() > 0


@pytest.mark.models
@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2", "gpt_neox", "mistral"])
def test_a_hugging_face_decoder_skips_the_draw_transformers_overwrites(arch: str) -> None:
    pytest.importorskip("transformers")
    model = load_workload("hf:causal-lm", "tiny", seed=0, model_args={"arch": arch}).model
    made = type(model)
    torch.manual_seed(0)
    once = built_once(lambda: made(model.config))
    skipped = torch.get_rng_state()
    # The workload's build is this one (seeded, then made with built_once).
    for (name, got), want in zip(
        model.state_dict().items(), once.state_dict().values(), strict=True
    ):
        assert torch.equal(got, want), name
    assert all(bool(torch.isfinite(w).all()) for w in once.parameters())
    # Its linears hold transformers' init (normal, std initializer_range), not torch's.
    std = model.config.initializer_range
    linears = [m.weight for m in once.modules() if isinstance(m, nn.Linear)]
    assert linears and all(abs(float(w.detach().std()) - std) < 0.3 * std for w in linears)
    # Made the usual way, the model draws more: the first draws were skipped, not made again.
    torch.manual_seed(0)
    made(model.config)
    assert not torch.equal(skipped, torch.get_rng_state())
