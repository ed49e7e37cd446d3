"""A training program as users write it, tuned as it is through the program protocol.

A plain PyTorch loop (an MLP regression on synthetic data): it reads the settings it implements
(`sync_interval`, `pin_memory`, `non_blocking`, `num_workers`) and the run's shape from the
STREAMTUNE_* variables through `trainers.program.Reporter`, and reports its losses and timed
windows. Registered in `programs.json` beside it:

    TUNER_PROGRAMS=examples/program/programs.json \\
        python -m tuner run --workload program:plain-mlp --preset tiny --trials 4

Run on its own (no STREAMTUNE_REPORT) it trains with its defaults and prints the last loss.
"""

from __future__ import annotations

import argparse
import contextlib

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainers import LoopConfig
from trainers.program import Reporter

PRESETS = {
    "tiny": {"batch": 16, "width": 32, "batches": 8},
    "small": {"batch": 256, "width": 512, "batches": 32},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny", choices=sorted(PRESETS))
    parser.add_argument("--steps", type=int, default=100, help="when run on its own")
    args = parser.parse_args()
    reporter = Reporter.from_env() if Reporter.active() else None
    config = reporter.config if reporter else LoopConfig()
    seed = reporter.seed if reporter else 0
    device = torch.device(reporter.device if reporter else "cpu")
    shape = PRESETS[args.preset]

    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Linear(16, shape["width"]), nn.ReLU(), nn.Linear(shape["width"], 1)
    ).to(device)
    if reporter:
        reporter.perturb(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(1234 + seed)
    x = torch.randn(shape["batch"] * shape["batches"], 16, generator=generator)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    loader = DataLoader(
        data,
        batch_size=shape["batch"],
        num_workers=config.num_workers,
        pin_memory=config.pin_memory and device.type == "cuda",
        persistent_workers=config.num_workers > 0,
    )

    def batches():  # type: ignore[no-untyped-def]
        while True:
            yield from loader

    stream = batches()
    losses: list[torch.Tensor] = []
    values: list[float] = []
    n_syncs = 0

    def step() -> None:
        nonlocal n_syncs
        inputs, targets = (t.to(device, non_blocking=config.non_blocking) for t in next(stream))
        loss = nn.functional.mse_loss(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
        if len(losses) % config.sync_interval == 0:
            # The host waits here: the sync interval this program implements.
            pending = losses[len(values) :]
            values.extend(torch.stack(pending).tolist())
            n_syncs += 1

    if reporter is None:
        for _ in range(args.steps):
            step()
        print(f"loss {float(losses[-1]):.4f}")
        return
    reporter.start(samples_per_batch=shape["batch"])
    for _ in range(reporter.warmup):
        step()
    for index, size in enumerate(reporter.window_sizes()):
        with reporter.window(index, size, device):
            for _ in range(size):
                step()
    values.extend(torch.stack(losses[len(values) :]).tolist() if len(losses) > len(values) else [])
    reporter.losses(0, values)
    reporter.end(n_syncs=n_syncs)
    with contextlib.suppress(AttributeError):
        loader._iterator._shutdown_workers()  # type: ignore[union-attr]


if __name__ == "__main__":
    main()
