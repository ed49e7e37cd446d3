"""A checkpointed block whose forward raises (an out-of-memory error above all) leaves nothing of
its checkpoint behind: torch before pytorch/pytorch#184018 (2.11 on the GPU image) left the
frame's saved-tensor hooks pushed, and every later checkpointed backward of the process failed
(the 1.1B preset's gate on an H100, after its reference ran out of memory)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils import checkpoint as torch_checkpoint

import trainers
from trainers.blocks import find_blocks
from trainers.recompute import close_checkpoint_frames
from trainers.workloads import load_workload


def checkpoint(function: Callable[..., Any], *args: Any) -> Any:
    """torch 2.11's non-reentrant `torch.utils.checkpoint.checkpoint`, as it was before the fix:
    the generator is left suspended when `function` raises. (The name matters: it is the frame
    `close_checkpoint_frames` looks for.)"""
    options: list[Any] = [True, torch_checkpoint.noop_context_fn, "default", False]
    if (
        "early_stop"
        in inspect.signature(torch_checkpoint._checkpoint_without_reentrant_generator).parameters
    ):
        options.append(True)  # the torch of this venv takes one more (2.13: early_stop)
    gen = torch_checkpoint._checkpoint_without_reentrant_generator(function, *options, *args)
    next(gen)
    ret = function(*args)
    try:
        next(gen)
    except StopIteration:
        return ret
    raise AssertionError("unreachable")


class Failing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.fail = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.tanh(self.linear(x))
        if self.fail:
            raise torch.OutOfMemoryError("planted: out of memory in the block")
        return torch.tanh(self.linear(y))


def _train_once(block: nn.Module) -> None:
    x = torch.randn(3, 4, requires_grad=True)
    # tanh outside the checkpoint saves its output: into the default hooks' frame, if any.
    torch.tanh(torch_checkpoint.checkpoint(block, x, use_reentrant=False)).sum().backward()


@pytest.mark.parametrize("closed", [False, True])
def test_a_failed_checkpointed_forward_leaves_later_backwards_intact(closed: bool) -> None:
    block = Failing()
    block.fail = True
    with pytest.raises(torch.OutOfMemoryError) as caught:
        checkpoint(block, torch.randn(3, 4, requires_grad=True))
    block.fail = False
    if not closed:
        # The old torch's state: what the next step saves goes into the dead frame.
        try:
            with pytest.raises(RuntimeError, match=r"torch\.utils\.checkpoint"):
                _train_once(block)
        finally:
            close_checkpoint_frames(caught.value)  # leave the process as it was
        _train_once(block)
        return
    assert close_checkpoint_frames(caught.value) == 1
    _train_once(block)  # no leaked hooks: trains as usual
    assert close_checkpoint_frames(caught.value) == 0  # closed once


def test_the_blocks_lever_closes_what_a_raising_block_left_open() -> None:
    """Through the lever itself: a forward that raises inside a checkpointed block, then a plain
    run and a checkpointed run of the same workload in the same process, as the gate's reference
    falls back after an out-of-memory error."""
    workload = load_workload("transformer", "tiny")
    blocks = find_blocks(workload.model)
    original = blocks[0].forward
    calls = {"n": 0}

    def raising(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        raise torch.OutOfMemoryError("planted: out of memory in block 0")

    blocks[0].forward = raising  # the instance attribute the lever wraps
    try:
        config = trainers.LoopConfig(activation_checkpointing="blocks")
        with pytest.raises(torch.OutOfMemoryError):
            trainers.run(
                workload, config, trainers.RunArgs(steps=1, warmup=0, windows=1, device="cpu")
            )
    finally:
        blocks[0].forward = original
    assert calls["n"] >= 1  # the run reached the block (the FLOP count may call it first)
    plain = trainers.run(
        workload,
        trainers.LoopConfig(),
        trainers.RunArgs(steps=2, warmup=0, windows=1, device="cpu"),
    )
    again = trainers.run(
        workload, config, trainers.RunArgs(steps=2, warmup=0, windows=1, device="cpu")
    )
    assert len(plain.losses) == len(again.losses) == 2
