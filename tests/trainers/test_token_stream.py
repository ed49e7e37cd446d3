"""The token stream of the `hf:` text workloads (`data=stream`, docs/data.md): batch i a function
of (seed, i) alone, never repeated within a gate's run, cheap to make, learnable, and fed by the
loop (workers, resume, data-parallel shards) exactly as the fixed batches were.

The stream itself needs only torch; the tests that build a model carry the `models` marker.
"""

from __future__ import annotations

import math
import pickle
import time

import pytest
import torch
from torch import nn

from trainers import LoopConfig, RunArgs, load_workload, run
from trainers.feed import close_loaders, positioned_batches
from trainers.parallel import shard_batch
from trainers.workloads import SyntheticBatches, Workload
from trainers.workloads.text import (
    CAUSAL_LM,
    FIRST_TOKEN,
    IGNORE,
    MASK,
    MASKED_LM,
    NOISE,
    SEQ_CLS,
    TokenStream,
    batch_seed,
    chain_tokens,
    jumps,
    make_dataset,
    successor_table,
    walk,
)

models = pytest.mark.models
TINY = {"batch": 2, "seq": 16, "vocab": 128, "classes": 3, "mask_prob": 0.15}
GATE_STEPS = 200  # the gate's long trajectory test (trainers/gate)


def loop_chain(successor: torch.Tensor, random: torch.Tensor, noisy: torch.Tensor) -> torch.Tensor:
    """The recurrence `walk` computes, one position at a time (how chain_tokens made it before)."""
    tokens = random.clone()
    for t in range(1, random.shape[-1]):
        follow = successor[tokens[..., t - 1] - FIRST_TOKEN]
        tokens[..., t] = torch.where(noisy[..., t], random[..., t], follow)
    return tokens


@pytest.mark.parametrize(("vocab", "shape"), [(16, (8, 2)), (128, (4, 16)), (50, (2, 3, 37))])
def test_walk_is_the_successor_chain_bit_for_bit(vocab: int, shape: tuple[int, ...]) -> None:
    generator = torch.Generator().manual_seed(vocab)
    successor = successor_table(vocab, generator)
    random = torch.randint(FIRST_TOKEN, vocab, shape, generator=generator)
    noisy = torch.rand(shape, generator=generator) < 0.3
    expected = loop_chain(successor, random, noisy)
    assert torch.equal(walk(jumps(successor, shape[-1]), random, noisy), expected)
    # Not vacuous: the chain follows the table somewhere and breaks somewhere.
    assert not torch.equal(expected, random)
    assert noisy[..., 1:].any()


def test_same_seed_same_batches_in_any_order_other_seed_differs() -> None:
    a, b, other = (TokenStream("causal-lm", TINY, seed) for seed in (0, 0, 1))
    # b read in another order, and far into the stream: a batch depends only on (seed, index).
    late = [b[i] for i in (10**9, 7, 3)]
    assert torch.equal(a[3][0], late[2][0]) and torch.equal(a[7][0], late[1][0])
    assert torch.equal(a[10**9][0], late[0][0])
    assert not torch.equal(a[3][0], other[3][0])
    assert not torch.equal(a[3][0], a[4][0])
    # Seed and index are hashed together, not added: seed 1's batch 0 does not draw what seed
    # 0's batch 1 draws.
    assert batch_seed(1, 0) != batch_seed(0, 1)
    assert len({batch_seed(seed, index) for seed in range(8) for index in range(8)}) == 64
    # Whatever the sampler hands over: a 0-d tensor index reads the same batch.
    assert torch.equal(a[torch.tensor(7)][0], a[7][0])  # type: ignore[index]
    with pytest.raises(IndexError):
        a[len(a)]


@pytest.mark.parametrize("kind", ["causal-lm", "masked-lm", "seq-cls"])
def test_no_batch_repeats_within_the_gates_steps(kind: str) -> None:
    stream = TokenStream(kind, TINY, seed=0)
    assert len(stream) >= 1 << 20
    seen = {tuple(stream[i][0].flatten().tolist()) for i in range(GATE_STEPS + 56)}
    assert len(seen) == GATE_STEPS + 56
    # Within a batch too, the sequences differ.
    first = stream[0][0]
    assert len({tuple(row.tolist()) for row in first}) == first.shape[0]


def test_every_batch_walks_the_seeds_one_table() -> None:
    """The learnable structure: apart from the NOISE share, a token is its predecessor's
    successor in the table the seed fixed, in every batch of the stream."""
    options = {**TINY, "batch": 8, "seq": 256}
    stream = TokenStream("causal-lm", options, seed=5)
    successor = successor_table(128, torch.Generator().manual_seed(6))
    for index in (0, 1, 999):
        (tokens,) = stream[index]
        assert tokens.dtype == torch.int64 and tokens.shape == (8, 256)
        assert int(tokens.min()) >= FIRST_TOKEN and int(tokens.max()) < 128
        follows = successor[tokens[:, :-1] - FIRST_TOKEN] == tokens[:, 1:]
        # NOISE of them drawn at random (a random draw may still hit the successor: 1/126).
        assert abs((1 - follows.float().mean().item()) - NOISE) < 0.03


def test_labels_of_the_encoder_kinds() -> None:
    ids, labels = TokenStream("masked-lm", TINY, seed=0)[2]
    masked = labels != IGNORE
    assert masked.any(dim=-1).all()  # every sequence has a token to predict
    assert (ids[masked] == MASK).all() and (ids[~masked] != MASK).all()
    ids, classes = TokenStream("seq-cls", TINY, seed=0)[2]
    assert torch.equal(classes, (ids[:, 0] - FIRST_TOKEN) % 3)


def best_of(make: object, repeats: int = 5) -> float:
    assert callable(make)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        make()
        times.append(time.perf_counter() - start)
    return min(times)


def test_making_a_large_batch_is_cheap_and_nothing_is_stored() -> None:
    """Without a loop over positions: 1.8-3 ms for 8 x 2048 on one thread of a shared 2-core
    machine, against 27 ms for the loop (TokenStream's docstring). Timed against the loop on the
    same machine at the same moment, so a busy machine slows both."""
    options = {"batch": 8, "seq": 2048, "vocab": 32000}
    stream = TokenStream("causal-lm", options, seed=0)
    generator = torch.Generator().manual_seed(0)
    random = torch.randint(FIRST_TOKEN, 32000, (8, 2048), generator=generator)
    noisy = torch.rand(8, 2048, generator=generator) < NOISE
    stream[0]
    indices = iter(range(1, 100))
    streamed = best_of(lambda: stream[next(indices)])
    looped = best_of(lambda: loop_chain(stream.successor, random, noisy))
    assert streamed < looped / 3, (streamed, looped)
    assert streamed < 0.05
    # It pickles (DataLoader workers) as its options and the table, not the batches it made,
    # nor the table's powers (made again where it lands).
    assert len(pickle.dumps(stream)) < 2 * 32000 * 8
    copy = pickle.loads(pickle.dumps(stream))
    assert torch.equal(copy[123][0], stream[123][0])


def tiny_workload(dataset: torch.utils.data.Dataset[tuple[torch.Tensor, ...]]) -> Workload:
    def loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        out: torch.Tensor = model(batch[0].float()).mean()
        return out

    return Workload(
        name="stream", preset="tiny", model=nn.Linear(16, 1), dataset=dataset, loss_fn=loss,
        samples_per_batch=2,
    )  # fmt: skip


@pytest.mark.parametrize("workers", [0, 2])
def test_the_feed_reads_the_stream_from_any_position_with_or_without_workers(
    workers: int,
) -> None:
    stream = TokenStream("causal-lm", TINY, seed=0)
    config = LoopConfig(num_workers=workers)
    opened: list[torch.utils.data.DataLoader[tuple[torch.Tensor, ...]]] = []
    try:
        batches = positioned_batches(
            tiny_workload(stream), config, torch.device("cpu"), 5, opened=opened
        )
        read = [next(batches)[0] for _ in range(4)]
    finally:
        close_loaders(opened)
    for offset, tokens in enumerate(read):
        assert torch.equal(tokens, stream[5 + offset][0])


def test_each_data_parallel_rank_trains_on_its_own_shard_of_the_same_global_batch() -> None:
    global_batch = TokenStream("causal-lm", {**TINY, "batch": 4}, seed=0)[11]
    shards = [shard_batch(global_batch, rank, 2)[0] for rank in range(2)]
    assert not torch.equal(shards[0], shards[1])
    assert torch.equal(torch.cat(shards), global_batch[0])


def test_presets_default_to_the_stream_and_fixed_batches_stay_reachable() -> None:
    for family, data in ((CAUSAL_LM, "stream"), (SEQ_CLS, "stream"), (MASKED_LM, "fixed")):
        assert family.option("data").default == data
    llama = CAUSAL_LM.preset_values("llama-1b")
    assert (llama["data"], llama["batches"]) == ("stream", 4)
    # data=fixed: the preset's 4 batches, made once, as before the stream.
    fixed = make_dataset("causal-lm", {**llama, "data": "fixed", "batch": 2, "seq": 8}, seed=0)
    assert isinstance(fixed, SyntheticBatches) and len(fixed) == 4
    options = {**llama, "batch": 2, "seq": 8}
    expected = chain_tokens(options, torch.Generator().manual_seed(1))
    assert torch.equal(fixed[3][0], expected[3])
    stream = make_dataset("causal-lm", options, seed=0)
    assert isinstance(stream, TokenStream)
    # The stream walks the very table data=fixed does (drawn first from seed + 1).
    assert torch.equal(stream.successor, successor_table(32000, torch.Generator().manual_seed(1)))


def test_a_data_value_outside_the_choices_names_them() -> None:
    from trainers.errors import WorkloadError
    from trainers.workloads import resolve_factory

    with pytest.raises(WorkloadError, match=r"model_arg.data='random' .*one of stream, fixed"):
        resolve_factory("hf:causal-lm", {"data": "random"})


# -- with a real model ------------------------------------------------------------------------


@models
@pytest.mark.parametrize("name", ["hf:causal-lm", "hf:masked-lm", "hf:seq-cls"])
def test_a_built_workload_is_deterministic_per_seed_on_the_stream(name: str) -> None:
    pytest.importorskip("transformers")
    args = {"data": "stream"}
    a, b, c = (load_workload(name, "tiny", seed=s, model_args=args) for s in (0, 0, 1))
    assert isinstance(a.dataset, TokenStream)
    for index in (0, 199):
        for ta, tb in zip(a.dataset[index], b.dataset[index], strict=True):
            assert torch.equal(ta, tb)
    assert not torch.equal(a.dataset[0][0], c.dataset[0][0])


@models
def test_a_tiny_causal_lm_learns_the_stream() -> None:
    """Learnable: the loss falls on batches it has never seen, towards what the table leaves
    unpredictable (the NOISE share), from about ln(vocab)."""
    pytest.importorskip("transformers")
    workload = load_workload("hf:causal-lm", "tiny", seed=0, model_args={"lr": "3e-3"})
    assert isinstance(workload.dataset, TokenStream)
    result = run(workload, LoopConfig(), RunArgs(steps=96, warmup=0, windows=1, device="cpu"))
    assert all(math.isfinite(loss) for loss in result.losses)
    first, last = (sum(part) / len(part) for part in (result.losses[:16], result.losses[-16:]))
    assert first > 0.9 * math.log(126)
    assert last < first - 0.5, (first, last)


@models
def test_data_parallel_ranks_each_train_their_shard_of_the_streams_global_batches() -> None:
    """Two gloo processes under DDP on the stream: each rank builds the workload from the seed,
    reads the same global batch i and keeps its half, so the ranks' losses differ and their
    mean is what one process gets accumulating the two halves as micro-batches."""
    pytest.importorskip("transformers")
    from trainers import parity_losses
    from trainers.program import run_distributed
    from trainers.workloads import resolve_factory

    args = {"arch": "llama", "batch": "4"}
    steps = 5
    run_args = RunArgs(steps=steps - 1, warmup=1, windows=2, device="cpu")
    config = LoopConfig(parallel="ddp")
    result = run_distributed(
        "hf:causal-lm", "tiny", config, run_args, nproc=2, gate=True, model_args=args
    )
    ranks = result.effective["rank_losses"]
    assert len(ranks) == 2 and ranks[0] != ranks[1]
    factory = resolve_factory("hf:causal-lm", args)
    accumulated = parity_losses(
        factory, "tiny", LoopConfig(micro_batches=2), RunArgs(steps=steps, device="cpu")
    )
    assert result.losses == pytest.approx(accumulated, rel=1e-5)
    assert len(set(result.losses)) == steps
