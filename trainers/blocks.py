"""A model's repeated blocks: where activation checkpointing and regional compilation apply.

A deep model is a stack of blocks of one class: Hugging Face decoder and encoder layers
(`LlamaDecoderLayer`, `GPT2Block`, `BertLayer`), timm's transformer and ConvNeXt blocks,
torchvision's residual blocks (`Bottleneck`, `BasicBlock`). They are found by structure, not by
name: the module class, among those with parameters and children of their own, that occurs at
least twice and is not nested inside another such class, holding the most parameters. A
workload may instead declare its blocks (`Workload.blocks`), and must where nothing repeats.
"""

from __future__ import annotations

from collections import Counter, defaultdict

from torch import nn

from trainers.errors import ConfigError
from trainers.workloads.base import Workload

DECLARE = (
    "declare them on the workload: Workload(..., blocks=lambda model: list(model.layers)), "
    "a function that returns the repeated nn.Modules in forward order"
)


def _candidates(model: nn.Module) -> dict[type[nn.Module], list[nn.Module]]:
    by_class: dict[type[nn.Module], list[nn.Module]] = defaultdict(list)
    for module in model.modules():
        if module is model:
            continue
        has_children = next(module.children(), None) is not None
        has_params = next(module.parameters(), None) is not None
        if has_children and has_params and not isinstance(module, nn.ModuleList | nn.Sequential):
            by_class[type(module)].append(module)
    return {cls: found for cls, found in by_class.items() if len(found) >= 2}


def find_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks in registration (forward) order; [] when nothing repeats."""
    candidates = _candidates(model)
    if not candidates:
        return []
    # A class whose every instance sits inside an instance of another candidate (an attention
    # module inside a decoder layer) is part of a block, not a block.
    inside: Counter[type[nn.Module]] = Counter()
    for blocks in candidates.values():
        for block in blocks:
            for sub in block.modules():
                if sub is not block and type(sub) in candidates:
                    inside[type(sub)] += 1
    outer = {
        cls: blocks for cls, blocks in candidates.items() if inside[cls] < len(candidates[cls])
    }
    best = max(
        outer.items(), key=lambda item: sum(p.numel() for b in item[1] for p in b.parameters())
    )
    return best[1]


def blocks_of(workload: Workload, *, field: str, value: object) -> list[nn.Module]:
    """The declared blocks of `workload`, or those found; ConfigError naming `field` and its
    `value` (the lever that needs blocks) if there are none."""
    declared = workload.blocks
    if declared is not None:
        found = list(declared(workload.model))
        if not found or not all(isinstance(b, nn.Module) for b in found):
            raise ConfigError(
                field,
                value,
                f"a workload whose `blocks` function returns a non-empty list of nn.Modules "
                f"({workload.name}'s returned {len(found)} items)",
            )
        return found
    found = find_blocks(workload.model)
    if not found:
        raise ConfigError(
            field,
            value,
            f"a model with repeated blocks; none were found in {type(workload.model).__name__} "
            f"(workload {workload.name}): " + DECLARE,
        )
    return found


def has_blocks(workload: Workload) -> bool:
    """Whether the block levers can apply to `workload` (declared or found blocks)."""
    if workload.blocks is not None:
        return bool(list(workload.blocks(workload.model)))
    return bool(find_blocks(workload.model))


def first_share(blocks: list[nn.Module], share: float) -> list[nn.Module]:
    """The first `share` of `blocks` (at least one): which blocks a partial lever covers. At the
    end of the forward every block's activations are alive, so which ones are covered changes the
    peak memory little; the first ones are covered, as torchtitan's selective option does."""
    count = max(1, round(len(blocks) * share))
    return blocks[:count]
