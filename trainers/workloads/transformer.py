"""Seq2seq `nn.Transformer` learning to reverse a sequence of tokens (copy/reverse task).

Shapes for small, medium and large are the ones the project first measured (H100, 2026-11-22);
`tiny` takes a few milliseconds a step on a CPU, for tests. Sources have random lengths (padding
masked in the encoder, the decoder and the cross-attention); the decoder has a causal mask.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch import nn

from trainers.workloads.base import Batch, SyntheticBatches, Workload, adam, check_preset

PAD, BOS = 0, 1
FIRST_TOKEN = 2


@dataclasses.dataclass(kw_only=True, frozen=True, slots=True)
class TransformerShape:
    d_model: int
    heads: int
    encoder_layers: int
    decoder_layers: int
    ff: int
    vocab: int
    batch: int
    seq: int
    dropout: float = 0.1
    n_batches: int = 32


PRESETS: dict[str, TransformerShape] = {
    "tiny": TransformerShape(
        d_model=32, heads=2, encoder_layers=1, decoder_layers=1, ff=64, vocab=16, batch=8, seq=8
    ),
    "small": TransformerShape(
        d_model=256,
        heads=4,
        encoder_layers=2,
        decoder_layers=2,
        ff=1024,
        vocab=1000,
        batch=64,
        seq=32,
    ),
    "medium": TransformerShape(
        d_model=512,
        heads=8,
        encoder_layers=4,
        decoder_layers=4,
        ff=2048,
        vocab=8000,
        batch=64,
        seq=64,
    ),
    "large": TransformerShape(
        d_model=1024,
        heads=16,
        encoder_layers=4,
        decoder_layers=4,
        ff=4096,
        vocab=16000,
        batch=32,
        seq=128,
    ),
}


class Seq2SeqTransformer(nn.Module):
    def __init__(self, shape: TransformerShape) -> None:
        super().__init__()
        self.scale = math.sqrt(shape.d_model)
        self.embed = nn.Embedding(shape.vocab, shape.d_model, padding_idx=PAD)
        self.position = nn.Embedding(shape.seq, shape.d_model)
        self.transformer = nn.Transformer(
            d_model=shape.d_model,
            nhead=shape.heads,
            num_encoder_layers=shape.encoder_layers,
            num_decoder_layers=shape.decoder_layers,
            dim_feedforward=shape.ff,
            dropout=shape.dropout,
            batch_first=True,
        )
        self.head = nn.Linear(shape.d_model, shape.vocab)
        # A buffer, so it moves with the model and keeps one address (CUDA graphs need that).
        causal = torch.triu(torch.ones(shape.seq, shape.seq, dtype=torch.bool), diagonal=1)
        self.register_buffer("causal_mask", causal, persistent=False)

    def forward(self, src: torch.Tensor, tgt_in: torch.Tensor) -> torch.Tensor:
        positions = self.position.weight[: src.shape[1]]
        src_pad = src == PAD
        out = self.transformer(
            self.embed(src) * self.scale + positions,
            self.embed(tgt_in) * self.scale + positions,
            tgt_mask=self.causal_mask,
            src_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_in == PAD,
            memory_key_padding_mask=src_pad,
            # Said explicitly: otherwise nn.Transformer compares the mask with a causal one on the
            # host (a device sync) to find out, which also makes the step impossible to capture.
            tgt_is_causal=True,
        )
        logits: torch.Tensor = self.head(out)
        return logits


def reverse_task(shape: TransformerShape, generator: torch.Generator) -> Batch:
    """(src, tgt_in, tgt_out) for `n_batches` batches: tgt_out is src's valid part reversed."""
    n, b, s = shape.n_batches, shape.batch, shape.seq
    tokens = torch.randint(FIRST_TOKEN, shape.vocab, (n, b, s), generator=generator)
    lengths = torch.randint(max(1, s // 2), s + 1, (n, b, 1), generator=generator)
    pos = torch.arange(s)
    valid = pos < lengths
    src = torch.where(valid, tokens, PAD)
    reversed_index = (lengths - 1 - pos).clamp(min=0)
    tgt_out = torch.where(valid, src.gather(-1, reversed_index), PAD)
    bos = torch.full((n, b, 1), BOS, dtype=src.dtype)
    tgt_in = torch.cat([bos, tgt_out[..., :-1]], dim=-1)
    return src, tgt_in, tgt_out


def reverse_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    src, tgt_in, tgt_out = batch
    logits = model(src, tgt_in)
    return F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD)


def build(preset: str, *, seed: int) -> Workload:
    check_preset("transformer", preset, PRESETS)
    shape = PRESETS[preset]
    torch.manual_seed(seed)
    model = Seq2SeqTransformer(shape)
    generator = torch.Generator().manual_seed(seed + 1)
    return Workload(
        name="transformer",
        preset=preset,
        model=model,
        dataset=SyntheticBatches(reverse_task(shape, generator)),
        loss_fn=reverse_loss,
        samples_per_batch=shape.batch,
        tokens_per_sample=2 * shape.seq,
        make_optimizer=adam(1e-4 if shape.d_model >= 512 else 3e-4),
    )
