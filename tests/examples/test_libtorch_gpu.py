"""The LibTorch trainer on a GPU: every stream, sync and graph setting runs through the protocol,
and its losses stay inside the envelope of its own eager reference (the gate a tuning job
applies). Written after the H100 runs of docs/benchmarks/libtorch-seed-h100-2026-11-23-*,
which ran these configs; 5 passed on an H100 at 9a42411
(docs/benchmarks/raw/libtorch-h100-2026-11-24/build-cli-gputests.log)."""

from __future__ import annotations

import pytest
import torch

from trainers import LoopConfig, RunArgs
from trainers.program import Program, program_parity, run_program

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

FEED = dict(pin_memory=True, non_blocking=True)
CONFIGS = {
    "idiom": LoopConfig(),
    "two-streams-event": LoopConfig(num_streams=2, sync_mode="event", sync_interval=10, **FEED),
    "three-streams-query": LoopConfig(num_streams=3, sync_mode="query", sync_interval=4, **FEED),
    "four-streams-prefetch": LoopConfig(num_streams=4, sync_interval=10, prefetch_depth=2, **FEED),
    "graph": LoopConfig(num_streams=2, sync_interval=10, cuda_graph=True, prefetch_depth=2, **FEED),
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_config_runs_on_the_gpu_and_passes_the_gate(program: Program, name: str) -> None:
    config = CONFIGS[name]
    result = run_program(
        program, "tiny", config, RunArgs(steps=20, warmup=5, windows=2, device="cuda")
    )
    assert len(result.losses) == 25 and all(w.wall_ms > 0 for w in result.windows)
    args = RunArgs(steps=20, seed=0, device="cuda", precision="tf32")
    verdict, _ = program_parity(program, "tiny", config, args)
    assert verdict["passed"], verdict["reason"]
