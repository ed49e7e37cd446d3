"""Does one run leave state behind that changes the next? Memory held and step time, run after run,
before and after a parity check and a CUDA-graph run (GPU only)."""

from __future__ import annotations

import gc
import os
import sys
import weakref
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from trainers import LoopConfig, check_parity, load_workload, run

preset = sys.argv[1] if len(sys.argv) > 1 else "small"
w = load_workload("transformer", preset)
initial = {k: v.clone() for k, v in w.model.state_dict().items()}
refs: list[weakref.ref] = []
make = w.make_optimizer


def tracked(params, capturable):  # type: ignore[no-untyped-def]
    opt = make(params, capturable)
    refs.append(weakref.ref(opt))
    return opt


w.make_optimizer = tracked


def once(label: str, config: LoopConfig) -> None:
    w.model.load_state_dict(initial)
    r = run(w, config, steps=60, warmup=10, windows=3, device="cuda")
    gc.collect()
    alive = sum(ref() is not None for ref in refs)
    workspace = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    print(
        f"{label:<28} {r.step_time_ms['median']:7.2f} ms  peak {r.peak_memory_bytes >> 20:6d}"
        f" MiB  allocated after {torch.cuda.memory_allocated() >> 20:6d} MiB  optimizers alive "
        f"{alive}/{len(refs)}  CUBLAS_WORKSPACE_CONFIG={workspace}",
        flush=True,
    )


for i in range(3):
    once(f"eager #{i}", LoopConfig())
once("seed-baseline", LoopConfig(num_streams=2, pin_memory=True, non_blocking=True))
print(
    "parity:",
    check_parity("transformer", LoopConfig(num_streams=2), 20, preset=preset, device="cuda").passed,
)
for i in range(2):
    once(f"eager after parity #{i}", LoopConfig())
once("graph", LoopConfig(cuda_graph=True, sync_interval=20, sync_mode="event"))
for i in range(2):
    once(f"eager after graph #{i}", LoopConfig())
once("workers 4", LoopConfig(num_workers=4, pin_memory=True, non_blocking=True))
for i in range(2):
    once(f"eager after workers #{i}", LoopConfig())
