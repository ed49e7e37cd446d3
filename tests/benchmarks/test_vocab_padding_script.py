"""benchmarks/vocab_padding.py's logic on the CPU: the padded head computes the same loss as the
head it pads, to the next multiple of 64 (the timings mean nothing here)."""

from __future__ import annotations

import torch

from benchmarks.vocab_padding import measure


def test_the_padded_head_gives_the_plain_heads_loss_at_every_variant() -> None:
    row = measure(width=32, vocab=1001, rows=64, device=torch.device("cpu"))
    assert row["padded_vocab"] == 1024
    # The padded rows' logits are sliced off before the loss: not a bit of it may change.
    assert row["loss_gap"] == 0.0
    timed = ("eager_ms", "eager_padded_ms", "compiled_ms", "compiled_padded_ms")
    assert all(float(row[k]) > 0 for k in timed)
