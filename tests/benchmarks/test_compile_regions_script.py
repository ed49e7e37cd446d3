"""benchmarks/compile_regions.py's marking on the CPU: each repeated block becomes a nested
compile region of a subclass of its own class, the whole model compiled around them computes
what it computed before (its figures are for a GPU)."""

from __future__ import annotations

import torch
from torch import nn

from benchmarks.compile_regions import mark_regions


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(16, 32), nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


class _Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(_Block() for _ in range(4))
        self.head = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x).square().mean()


def _loss_and_grad(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    loss = torch.compile(model, backend="aot_eager")(x)
    loss.backward()
    grad = model.blocks[0].up.weight.grad
    assert grad is not None
    return loss.detach(), grad


def test_marked_blocks_compile_to_the_same_loss_and_gradients() -> None:
    torch.manual_seed(0)
    plain = _Stack()
    marked = _Stack()
    marked.load_state_dict(plain.state_dict())
    assert mark_regions(marked) == 4
    kinds = {type(block) for block in marked.blocks}
    assert len(kinds) == 1 and issubclass(kinds.pop(), _Block)
    assert type(marked.head) is nn.Linear  # only the repeated blocks
    x = torch.randn(5, 16)
    torch._dynamo.reset()
    loss, grad = _loss_and_grad(plain, x)
    torch._dynamo.reset()
    marked_loss, marked_grad = _loss_and_grad(marked, x)
    torch.testing.assert_close(marked_loss, loss)
    torch.testing.assert_close(marked_grad, grad)
    assert mark_regions(nn.Linear(2, 2)) == 0  # nothing repeats: nothing marked
