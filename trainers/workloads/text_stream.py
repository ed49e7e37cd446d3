"""The token sequences of the `hf:` text workloads (`trainers.workloads.text`): a chain through a
fixed random successor table with random breaks (`NOISE`), labelled for each model kind
(`label`); by default a stream that never repeats a batch (`TokenStream`, data=stream,
docs/data.md), else `batches` fixed batches made once and cycled (data=fixed).
"""

from __future__ import annotations

import operator
from collections.abc import Mapping
from typing import Any

import torch
from torch.utils.data import Dataset

from trainers.workloads.base import Batch, SyntheticBatches
from trainers.workloads.options import Value

PAD, MASK = 0, 1
FIRST_TOKEN = 2  # ids below are reserved (BERT's padding and [MASK])
IGNORE = -100  # the label transformers' losses skip
NOISE = 0.1  # share of tokens drawn at random instead of from the successor table


def successor_table(vocab: int, generator: torch.Generator) -> torch.Tensor:
    """The chain's fixed random successor of each token: entry t - FIRST_TOKEN is the token that
    follows t (a permutation of [FIRST_TOKEN, vocab)). Drawn once per seed: the structure a
    model learns, the same in every batch."""
    return FIRST_TOKEN + torch.randperm(vocab - FIRST_TOKEN, generator=generator)


def jumps(successor: torch.Tensor, seq: int) -> torch.Tensor:
    """(log2(seq), len(successor)): row j is the successor table applied 2**j times, indexed by
    token - FIRST_TOKEN; what `walk` needs for sequences of `seq` tokens."""
    rows = [successor]
    for _ in range(1, max(1, (seq - 1).bit_length())):
        rows.append(rows[-1][rows[-1] - FIRST_TOKEN])
    return torch.stack(rows)


def walk(powers: torch.Tensor, random: torch.Tensor, noisy: torch.Tensor) -> torch.Tensor:
    """The chain over the last dimension: token t is `random[t]` where `noisy[t]` (and at t=0),
    else the successor of token t-1, the recurrence

        tokens[0] = random[0]; tokens[t] = random[t] if noisy[t] else successor(tokens[t-1])

    computed without a loop over positions: a token `hops` steps after the last random one is
    that token advanced `hops` times through the table, which its binary powers (`powers`, from
    `jumps`) do in log2(seq) gathers over the whole tensor. The same tokens as the loop, bit for
    bit (tests/trainers/test_token_stream.py)."""
    seq = random.shape[-1]
    position = torch.arange(seq)
    # Where each token's run began: the last noisy position at or before it, else 0.
    began = torch.where(noisy, position, 0).cummax(dim=-1).values
    hops = position - began
    tokens = random.gather(-1, began)
    for bit in range((seq - 1).bit_length()):
        tokens = torch.where((hops >> bit) & 1 == 1, powers[bit][tokens - FIRST_TOKEN], tokens)
    return tokens


def chain_tokens(options: Mapping[str, Value], generator: torch.Generator) -> torch.Tensor:
    """int64 token ids in [FIRST_TOKEN, vocab), (batches, batch, seq): each token follows its
    predecessor through a fixed random successor table, or is drawn at random (NOISE), so a
    language model has something to learn and its loss falls. The batches of data=fixed."""
    n, b, s = int(options["batches"]), int(options["batch"]), int(options["seq"])
    successor = successor_table(int(options["vocab"]), generator)
    random = torch.randint(FIRST_TOKEN, int(options["vocab"]), (n, b, s), generator=generator)
    noisy = torch.rand(n, b, s, generator=generator) < NOISE
    return walk(jumps(successor, s), random, noisy)


def label(
    kind: str, tokens: torch.Tensor, options: Mapping[str, Value], generator: torch.Generator
) -> Batch:
    """The batch (or stacked batches) of a model `kind` made from `tokens`: what it reads and
    what it is trained to predict; masked-lm draws its masks from `generator`."""
    if kind == "causal-lm":
        return (tokens,)  # the labels are the ids: the model shifts them itself
    if kind == "seq-cls":
        # The class is read from the first token, which BERT's pooler sees directly.
        return tokens, (tokens[..., 0] - FIRST_TOKEN) % int(options["classes"])
    masked = torch.rand(tokens.shape, generator=generator) < float(options["mask_prob"])
    # One forced mask per sequence: a batch with nothing to predict would make the loss NaN.
    forced = torch.randint(0, tokens.shape[-1], (*tokens.shape[:-1], 1), generator=generator)
    masked.scatter_(-1, forced, True)
    return torch.where(masked, MASK, tokens), torch.where(masked, tokens, IGNORE)


def make_batches(kind: str, options: Mapping[str, Value], generator: torch.Generator) -> Batch:
    """The `batches` batches of data=fixed, stacked (SyntheticBatches)."""
    return label(kind, chain_tokens(options, generator), options, generator)


_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    """SplitMix64's finaliser: nearby inputs (seed 0 and 1, batch 5 and 6) give unrelated 64-bit
    outputs, so consecutive batches and neighbouring seeds get generators that look unrelated
    (`seed + index` would give seed 0's batch 1 and seed 1's batch 0 the same tokens)."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def batch_seed(seed: int, index: int) -> int:
    """The generator seed of batch `index` of the stream of `seed`, in [0, 2**64)."""
    return _splitmix64(_splitmix64(seed & _MASK64) ^ index)


STREAM_LENGTH = 1 << 30
"""Batches in a stream: more than any run takes (the feed reads batch `step % len`, and a
billion steps at a millisecond each is 12 days), so no batch repeats within a run. Nothing
lists them: the feed's samplers and subsets are ranges, and each batch is made when it is read."""


class TokenStream(Dataset[Batch]):
    """The batches of data=stream: batch i is a deterministic function of (seed, i), made when it
    is read, never stored, so every step trains on a batch the model has not seen.

    Every batch walks the same successor table (`successor_table`, fixed per seed: the learnable
    structure, the same one data=fixed uses); its random tokens, where the chain breaks
    (NOISE) and masked-lm's masks come from a generator seeded by `batch_seed(seed, i)`, fresh
    per index. So the batch depends on nothing but (options, seed, i): not on the process, the
    DataLoader worker or the order of reads (a resumed run, another config in the gate, each
    data-parallel rank slicing its shard of the same global batch all see the same tokens), and
    reading it draws nothing from torch's global generators. It pickles as its options and the
    table, for DataLoader workers.

    Making a batch takes 1.8-3 ms for 8 x 2048 tokens and 3.2-4.8 ms for 16 x 2048 on one CPU
    thread (torch 2.14, a shared 2-core machine; the loop over positions of `chain_tokens` before
    `walk` took 27 ms for 8 x 2048): well inside a 1B model's step, and made in a DataLoader
    worker when the loop has them.
    """

    def __init__(
        self, kind: str, options: Mapping[str, Value], seed: int, *, length: int = STREAM_LENGTH
    ) -> None:
        self.kind = kind
        # Only what a batch needs: plain values, so the dataset pickles small and alone.
        self.options: dict[str, Value] = {
            key: options[key]
            for key in ("batch", "seq", "vocab", "classes", "mask_prob")
            if key in options
        }
        self.seed = seed
        self.length = length
        self.successor = successor_table(
            int(options["vocab"]), torch.Generator().manual_seed(seed + 1)
        )
        self._powers: torch.Tensor | None = None

    def __getstate__(self) -> dict[str, Any]:
        # The table's powers are log2(seq) times its size (136 MB at vocab 1M, seq 131072): made
        # again where the dataset lands (a worker) rather than pickled to it.
        return {**vars(self), "_powers": None}

    def powers(self) -> torch.Tensor:
        if self._powers is None:
            self._powers = jumps(self.successor, int(self.options["seq"]))
        return self._powers

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> Batch:
        # A plain int, whatever the sampler handed over (a numpy or 0-d tensor index would
        # otherwise reach the seed's arithmetic).
        index = operator.index(index)
        if not 0 <= index < self.length:
            raise IndexError(f"batch {index} of a stream of {self.length}")
        generator = torch.Generator().manual_seed(batch_seed(self.seed, index))
        shape = (int(self.options["batch"]), int(self.options["seq"]))
        random = torch.randint(FIRST_TOKEN, int(self.options["vocab"]), shape, generator=generator)
        noisy = torch.rand(shape, generator=generator) < NOISE
        return label(self.kind, walk(self.powers(), random, noisy), self.options, generator)


def make_dataset(kind: str, options: Mapping[str, Value], seed: int) -> Dataset[Batch]:
    """The workload's batches: a TokenStream (data=stream), or `batches` fixed ones."""
    if options["data"] == "stream":
        return TokenStream(kind, options, seed)
    return SyntheticBatches(make_batches(kind, options, torch.Generator().manual_seed(seed + 1)))
