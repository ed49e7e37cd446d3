"""Micro-batches under data parallelism reduce their gradients once per step, in the last one
(DDP's `no_sync`, FSDP2's `set_requires_gradient_sync(False)`): two real gloo processes train
`mlp` `tiny` through the loop core (`trainers.core.Engine`), and the result is the one process
that accumulates every piece of the global batch and steps once.

DDP's all-reduces are counted by a communication hook registered on the run's own DDP module
(`register_comm_hook`, DDP's API for replacing its all-reduce): the hook still all-reduces, so
the training is unchanged, and each call is one bucket's all-reduce."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

from trainers import LoopConfig
from trainers.core import Engine
from trainers.parallel import parameter_digest
from trainers.workloads import disable_dropout, load_workload

STEPS = 3
WORLD = 2


def _train(config: LoopConfig, count_all_reduces: bool) -> dict[str, Any]:
    """`STEPS` steps of `mlp` `tiny` under `config` in this process (dropout off: every rank and
    the reference draw nothing random); the losses, a parameter digest and the all-reduces."""
    workload = load_workload("mlp", "tiny", seed=0)
    disable_dropout(workload.model)
    engine = Engine(workload, config, device="cpu", count_flops=False)
    calls = [0]
    if count_all_reduces:
        # Unannotated: DDP compares the `bucket` annotation with dist.GradBucket itself, and
        # this module's annotations are strings.
        def counted(state, bucket):  # type: ignore[no-untyped-def]
            calls[0] += 1
            return allreduce_hook(state, bucket)

        engine.step_model.register_comm_hook(None, counted)  # type: ignore[operator]
    with engine.session(capacity=STEPS) as session:
        for index in range(STEPS):
            session.step(index)
        session.drain()
        losses = list(session.losses)
    engine.close()
    return {"losses": losses, "digest": parameter_digest(engine.model), "all_reduces": calls[0]}


def _rank(rank: int, init: str, config_json: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    try:
        config = LoopConfig.from_dict(json.loads(config_json))
        found = _train(config, count_all_reduces=config.parallel == "ddp")
        Path(out, f"rank{rank}.json").write_text(json.dumps(found), encoding="utf-8")
    finally:
        dist.destroy_process_group()
    # Written and left the group: exit without the interpreter's teardown, in which FSDP2 over
    # gloo aborts now and then (as trainers.distributed does, and for the same reason).
    os._exit(0)


def _two_ranks(config: LoopConfig, folder: Path) -> list[dict[str, Any]]:
    folder.mkdir()
    init = f"file://{folder / 'rendezvous'}"
    mp.spawn(_rank, args=(init, json.dumps(config.to_dict()), str(folder)), nprocs=WORLD)
    return [
        json.loads((folder / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(WORLD)
    ]


def test_ddp_micro_batches_all_reduce_once_per_step_and_train_the_accumulated_model(
    tmp_path: Path,
) -> None:
    one = _two_ranks(LoopConfig(parallel="ddp"), tmp_path / "one")
    four = _two_ranks(LoopConfig(parallel="ddp", micro_batches=4), tmp_path / "four")
    per_step = one[0]["all_reduces"] // STEPS
    assert per_step >= 1 and one[0]["all_reduces"] == per_step * STEPS
    # Four micro-batches: the same all-reduces as one (an all-reduce per micro-batch would be
    # four times as many), on both ranks.
    assert [r["all_reduces"] for r in four] == [per_step * STEPS] * WORLD
    # DDP's replicas stay identical, and equal one process that accumulates the 2 x 4 pieces
    # of each global batch and steps once: the same mean gradient, up to summation order.
    assert four[0]["digest"] == four[1]["digest"]
    alone = _train(LoopConfig(micro_batches=8), count_all_reduces=False)
    assert four[0]["digest"] == pytest.approx(alone["digest"], rel=1e-5, abs=1e-6)
    assert four[0]["digest"] != pytest.approx(_untrained_digest(), rel=1e-3)  # it trained
    mean = [(a + b) / 2 for a, b in zip(four[0]["losses"], four[1]["losses"], strict=True)]
    assert mean == pytest.approx(alone["losses"], rel=1e-5)


def test_fsdp2_micro_batches_train_the_accumulated_model(tmp_path: Path) -> None:
    # Every micro-batch but the last keeps its gradients unsharded and unreduced; the last
    # reduce-scatters their sum: the same model as one process accumulating the 8 pieces.
    ranks = _two_ranks(LoopConfig(parallel="fsdp2", micro_batches=4), tmp_path / "fsdp2")
    alone = _train(LoopConfig(micro_batches=8), count_all_reduces=False)
    assert ranks[0]["digest"] == pytest.approx(alone["digest"], rel=1e-5, abs=1e-6)
    mean = [(a + b) / 2 for a, b in zip(ranks[0]["losses"], ranks[1]["losses"], strict=True)]
    assert mean == pytest.approx(alone["losses"], rel=1e-5)


def _untrained_digest() -> list[float]:
    workload = load_workload("mlp", "tiny", seed=0)
    return parameter_digest(workload.model)
