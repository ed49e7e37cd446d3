"""The memory-for-compute levers on a GPU, on a small Llama-style decoder from transformers (bf16):
checkpointing keeps the losses and lowers the peak, micro-batches lower the peak and train the
same model, regional compilation compiles once for all blocks, and the run reports MFU.
Skipped without CUDA; needs the `models` extra (transformers). Run on an H100:
docs/benchmarks/scale-gpu-*.
"""

from __future__ import annotations

import pytest
import torch

from trainers import LoopConfig, RunArgs, RunResult, load_workload, run
from trainers.workloads import disable_dropout

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.models,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

pytest.importorskip("transformers")

# 8 sequences of 512 tokens, 4 layers of width 512 (GQA 8/2): big enough that activations
# dominate the peak, small enough to compile in seconds.
ARGS = {
    "arch": "llama",
    "hidden": "512",
    "layers": "4",
    "heads": "8",
    "kv_heads": "2",
    "vocab": "8192",
    "seq": "512",
    "batch": "8",
    "batches": "4",
}
FEED = {"num_streams": 2, "sync_mode": "event", "sync_interval": 5, "prefetch_depth": 2}
FEED |= {"pin_memory": True, "non_blocking": True}


def _run(config: LoopConfig, *, steps: int = 10, warmup: int = 2) -> RunResult:
    workload = load_workload("hf:causal-lm", "small", seed=0, model_args=ARGS)
    disable_dropout(workload.model)
    torch.cuda.empty_cache()
    return run(
        workload,
        config,
        RunArgs(steps=steps, warmup=warmup, windows=2, device="cuda", precision="bf16-autocast"),
    )


def test_checkpointing_keeps_every_loss_and_lowers_the_peak() -> None:
    plain = _run(LoopConfig(**FEED))
    full = _run(LoopConfig(activation_checkpointing="blocks", **FEED))
    half = _run(LoopConfig(activation_checkpointing="blocks", checkpoint_share=0.5, **FEED))
    selective = _run(LoopConfig(activation_checkpointing="selective", **FEED))
    # Eager recompute runs the same kernels on the same inputs, but the backward may pick other
    # kernels for the recomputed buffers: at step 10, 8.250440 against 8.250459 (f111199). Close,
    # not always equal, which is why the gate judges checkpointing by equivalence.
    assert full.losses == pytest.approx(plain.losses, rel=1e-4)
    assert selective.losses == pytest.approx(plain.losses, rel=1e-4)
    assert plain.peak_memory_bytes and full.peak_memory_bytes and half.peak_memory_bytes
    assert full.peak_memory_bytes < half.peak_memory_bytes < plain.peak_memory_bytes
    assert selective.peak_memory_bytes is not None
    assert selective.peak_memory_bytes < plain.peak_memory_bytes


@pytest.mark.parametrize("pieces", [2, 4])
def test_micro_batches_lower_the_peak_and_train_the_same_model(pieces: int) -> None:
    plain = _run(LoopConfig(**FEED))
    split = _run(LoopConfig(micro_batches=pieces, **FEED))
    assert split.peak_memory_bytes is not None and plain.peak_memory_bytes is not None
    assert split.peak_memory_bytes < plain.peak_memory_bytes
    # bf16 and another order of the gradient sums: close, not equal.
    assert split.losses == pytest.approx(plain.losses, rel=2e-2)


def test_micro_batches_inside_a_whole_step_graph() -> None:
    # The same warm-up (a graph needs 4: 3 eager steps and the capture), so the same losses.
    eager = _run(LoopConfig(micro_batches=2, **FEED), warmup=4)
    graph = _run(LoopConfig(micro_batches=2, cuda_graph=True, optimizer="fused", **FEED), warmup=4)
    assert graph.losses == pytest.approx(eager.losses, rel=2e-2)


def test_each_block_compiled_on_its_own_composes_with_checkpointing() -> None:
    whole = _run(LoopConfig(compile="default", optimizer="fused", **FEED))
    blocks = _run(LoopConfig(compile="default", compile_scope="blocks", optimizer="fused", **FEED))
    both = _run(
        LoopConfig(
            compile="default",
            compile_scope="blocks",
            activation_checkpointing="selective",
            optimizer="fused",
            **FEED,
        )
    )
    for result in (blocks, both):
        assert result.losses == pytest.approx(whole.losses, rel=2e-2)
        assert not result.compile_unstable, result.compile_notes
    assert both.peak_memory_bytes is not None and blocks.peak_memory_bytes is not None
    assert both.peak_memory_bytes < blocks.peak_memory_bytes


def test_the_run_reports_mfu_on_a_known_gpu() -> None:
    result = _run(LoopConfig(compile="default", optimizer="fused", **FEED)).to_dict()
    assert result["flops_per_step"] > 0
    if result["mfu"] is None:
        pytest.skip(f"no peak known: {result['mfu_note']}")
    assert 0.01 < result["mfu"] < 1.0, result
