"""Levers on a model's repeated blocks (`trainers.blocks`): activation checkpointing and regional
compilation. Both change the blocks in place and give back an `undo` that restores them, so the
workload's model is the same module (same parameters, same `state_dict` keys) before and after.

Activation checkpointing (`LoopConfig.activation_checkpointing`):
- `blocks`: `torch.utils.checkpoint` (non-reentrant) around each covered block: its forward
  keeps only its inputs, and the backward runs the block's forward again. The most memory saved,
  at the cost of one more forward of the covered blocks.
- `selective`: the same wrapper with PyTorch's selective activation checkpoint policy: the
  outputs of matmuls, convolutions and attention (the expensive ops) are kept, the cheap
  elementwise ops and normalisations are recomputed. Less memory saved, little recompute.
`checkpoint_share` covers the first share of the blocks: recomputing only as many blocks as the
memory requires is where a search beats the all-or-nothing switch.

Regional compilation (`LoopConfig.compile_scope="blocks"`): `torch.compile` each block instead of
the whole model (`nn.Module.compile`, in place; for torch.nn's own layers, whose frames Dynamo
skips, a frame of ours around the block's forward). The blocks share one class and one shape, so
Dynamo compiles the block once and reuses it: a shorter cold compile on deep models, and on the
1.1B decoder of GPU-FACTS a faster step than whole-model compilation.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from trainers.blocks import blocks_of, first_share
from trainers.config import LoopConfig
from trainers.workloads.base import Workload

Undo = Callable[[], None]

_aten = torch.ops.aten
# Kept by the selective policy: the ops whose outputs cost the most to recompute.
_SAVED = {
    _aten.mm.default,
    _aten.addmm.default,
    _aten.bmm.default,
    _aten.baddbmm.default,
    _aten.convolution.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
}


def _selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in _SAVED else CheckpointPolicy.PREFER_RECOMPUTE


def _checkpointed(block: nn.Module, selective: bool) -> Undo:
    inner = block.forward
    context_fn = (
        functools.partial(create_selective_checkpoint_contexts, _selective_policy)
        if selective
        else None
    )

    def forward(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return inner(*args, **kwargs)  # evaluation: nothing is kept for a backward anyway
        try:
            if context_fn is None:
                return checkpoint(inner, *args, use_reentrant=False, **kwargs)
            return checkpoint(inner, *args, use_reentrant=False, context_fn=context_fn, **kwargs)
        except BaseException as exc:
            close_checkpoint_frames(exc)
            raise

    # An instance attribute: `nn.Module.__call__` looks `forward` up on the instance first.
    block.forward = forward

    def undo() -> None:
        del block.forward

    return undo


def close_checkpoint_frames(exc: BaseException) -> int:
    """Close the checkpoint generators that `exc` unwound through without closing; how many.

    Before pytorch/pytorch#184018 (torch 2.12), a non-reentrant `checkpoint` whose forward raised
    left its generator suspended inside `with _checkpoint_hook(frame)`: the frame's saved-tensor
    hooks stayed pushed, every later forward of the process saved its tensors into that dead
    frame, and the next checkpointed backward failed with "A different number of tensors was
    saved during the original forward and recomputation" (691, then 1142, 1320, 1973 saved:
    H100, torch 2.11, the 1.1B preset's gate after an out-of-memory reference). Closing the
    generator here, while its hooks are still the top of the stack, pops them in order; on a
    torch with the fix the generator is already finished and this does nothing."""
    closed = 0
    trace = exc.__traceback__
    while trace is not None:
        frame = trace.tb_frame
        gen = frame.f_locals.get("gen") if frame.f_code.co_name == "checkpoint" else None
        if inspect.isgenerator(gen) and gen.gi_frame is not None:
            gen.close()
            closed += 1
        trace = trace.tb_next
    return closed


def _compiled(block: nn.Module, mode: str) -> Undo:
    chosen = None if mode == "default" else mode
    if getattr(type(block).forward, "__module__", "").split(".")[0] != "torch":
        had_impl = "_compiled_call_impl" in vars(block)
        impl = vars(block).get("_compiled_call_impl")
        block.compile(mode=chosen)

        def undo() -> None:
            # Deleted, not set to None: Dynamo guards the keys of a module's `__dict__`, and a
            # block left holding `_compiled_call_impl = None` fails the guards of code compiled
            # on a fresh model's blocks (and theirs fail on it). On an H200 (2026-12-02,
            # Qwen1.5-0.5B) the gate's fresh model missed the leader's kept whole-model code
            # for that key alone, compiled again (22 s), and the final round compiled both
            # finalists again (76 s).
            if had_impl:
                block._compiled_call_impl = impl
            else:
                vars(block).pop("_compiled_call_impl", None)

        return undo
    # A block whose forward is torch.nn's own (nn.TransformerEncoderLayer, nn.MultiheadAttention,
    # or a subclass of one that keeps its forward): Dynamo skips a frame of torch's own code,
    # and `nn.Module.compile` compiles one (`_call_impl`), so nothing compiled and the block ran
    # eagerly (the run said so: NOTHING_COMPILED). The
    # compiled frame begins here instead, in ours, around the block's forward (the checkpointed
    # one, where that wraps it), and Dynamo traces into it as it does within a whole model; its
    # hooks run around it, as `_call_impl` runs them.
    had = "forward" in vars(block)
    inner = block.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        return inner(*args, **kwargs)

    block.forward = torch.compile(forward, mode=chosen)

    def undo_forward() -> None:
        if had:
            block.forward = inner
        else:
            del block.forward

    return undo_forward


def apply_block_levers(workload: Workload, config: LoopConfig) -> Undo:
    """Wrap `workload.model`'s blocks as `config` says; the returned `undo` restores them.
    ConfigError (naming the field) when a lever is asked for and the model has no known blocks."""
    # Every block list first: a lever refused for want of blocks leaves the model untouched.
    checkpointed: list[nn.Module] = []
    compiled: list[nn.Module] = []
    if config.activation_checkpointing != "none":
        blocks = blocks_of(
            workload, field="activation_checkpointing", value=config.activation_checkpointing
        )
        checkpointed = first_share(blocks, config.checkpoint_share)
    if config.compile != "none" and config.compile_scope == "blocks":
        compiled = blocks_of(workload, field="compile_scope", value=config.compile_scope)
    selective = config.activation_checkpointing == "selective"
    undos = [_checkpointed(b, selective) for b in checkpointed]
    # After the checkpoint wrapper: the compiled block runs the wrapped forward, so the
    # recomputation happens inside the compiled region (as torchtitan composes them).
    undos += [_compiled(b, config.compile) for b in compiled]

    def undo() -> None:
        for step in reversed(undos):
            step()

    return undo
