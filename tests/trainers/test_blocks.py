"""Repeated blocks (`trainers.blocks`) and the scale levers' validity rules (`LoopConfig`)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainers import ConfigError, LoopConfig
from trainers.blocks import blocks_of, find_blocks, first_share
from trainers.recompute import apply_block_levers
from trainers.workloads import load_workload


class Attention(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.q = nn.Linear(width, width)
        self.o = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.o(torch.tanh(self.q(x)))


class Layer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.attention = Attention(width)
        self.mlp = nn.Sequential(
            nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(x + self.attention(x))


class Stack(nn.Module):
    def __init__(self, width: int = 8, depth: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(3, width)
        self.layers = nn.ModuleList(Layer(width) for _ in range(depth))
        self.head = nn.Linear(width, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h)
        return self.head(h)


def test_the_outer_repeated_class_is_the_block() -> None:
    model = Stack()
    found = find_blocks(model)
    assert [type(b) for b in found] == [Layer] * 4
    assert found == list(model.layers)


def test_a_model_without_repeated_blocks_has_none_and_the_lever_says_how_to_declare() -> None:
    workload = load_workload("mlp", "tiny", seed=0)  # Linear layers only: leaves, not blocks
    assert find_blocks(workload.model) == []
    with pytest.raises(ConfigError, match=r"activation_checkpointing='blocks'.*blocks=lambda"):
        blocks_of(workload, field="activation_checkpointing", value="blocks")


def test_declared_blocks_win() -> None:
    workload = load_workload("mlp", "tiny", seed=0)
    linears = [m for m in workload.model if isinstance(m, nn.Linear)]
    workload.blocks = lambda model: [m for m in model if isinstance(m, nn.Linear)]
    assert blocks_of(workload, field="compile_scope", value="blocks") == linears
    workload.blocks = lambda model: []
    with pytest.raises(ConfigError, match="compile_scope='blocks'"):
        blocks_of(workload, field="compile_scope", value="blocks")


@pytest.mark.parametrize(("share", "count"), [(0.25, 1), (0.5, 2), (1.0, 4)])
def test_the_share_covers_the_first_blocks(share: float, count: int) -> None:
    blocks = list(Stack().layers)
    assert first_share(blocks, share) == blocks[:count]


def test_the_builtin_transformer_has_blocks() -> None:
    workload = load_workload("transformer", "tiny", seed=0)
    found = find_blocks(workload.model)
    assert len(found) >= 2 and len({type(b) for b in found}) == 1


def test_checkpointing_is_undone_and_keeps_the_state_dict() -> None:
    workload = load_workload("transformer", "tiny", seed=0)
    keys = list(workload.model.state_dict())
    undo = apply_block_levers(
        workload, LoopConfig(activation_checkpointing="selective", checkpoint_share=0.5)
    )
    blocks = find_blocks(workload.model)
    assert "forward" in vars(blocks[0]) and "forward" not in vars(blocks[-1])
    assert list(workload.model.state_dict()) == keys
    undo()
    assert all("forward" not in vars(b) for b in blocks)


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"micro_batches": 3}, "micro_batches"),
        ({"micro_batches": 2.0}, "micro_batches"),
        ({"micro_batches": True}, "micro_batches"),
        ({"activation_checkpointing": "all"}, "activation_checkpointing"),
        ({"activation_checkpointing": "blocks", "checkpoint_share": 0.3}, "checkpoint_share"),
        ({"checkpoint_share": 0.5}, "checkpoint_share"),
        ({"compile_scope": "layers"}, "compile_scope"),
        ({"compile_scope": "blocks"}, "compile_scope"),
        ({"compile_scope": "blocks", "compile": "reduce-overhead"}, "compile_scope"),
        ({"micro_batches": 2, "compile": "reduce-overhead"}, "micro_batches"),
        ({"activation_checkpointing": "blocks", "cuda_graph": True}, "activation_checkpointing"),
    ],
)
def test_invalid_scale_levers_name_their_field(values: dict[str, object], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        LoopConfig.from_dict(values)
    assert caught.value.field == field


@pytest.mark.parametrize(
    "values",
    [
        {"micro_batches": 8, "cuda_graph": True},
        {"activation_checkpointing": "selective", "checkpoint_share": 0.25, "compile": "default"},
        {"compile": "max-autotune-no-cudagraphs", "compile_scope": "blocks"},
        {"compile": "default", "compile_scope": "blocks", "activation_checkpointing": "blocks"},
    ],
)
def test_valid_scale_levers(values: dict[str, object]) -> None:
    config = LoopConfig.from_dict(values)
    assert LoopConfig.from_dict(config.to_dict()) == config
