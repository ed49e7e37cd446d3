"""A run puts the model back as a fresh one is, key for key in every module's `__dict__`.

Dynamo guards what a compiled forward reads on a module instance, the presence of a key among
it (`nn.Module.__call__` reads `_compiled_call_impl`; transformers' `loss_function` asks
`hasattr(self, "_loss_function")`). The search runs many configs on one model, and the gate and
the final round run the kept whole-model code on fresh models: a key a lever left behind made
that code compile again there (2026-12-02, H200, Qwen1.5-0.5B in float8: 22 s in the gate, and
the final round then compiled both finalists again, 76 s)."""

from __future__ import annotations

import pytest
import torch

from trainers import LoopConfig, RunArgs, load_workload, run

pytestmark = pytest.mark.models


def _keys(model: torch.nn.Module) -> dict[str, set[str]]:
    return {name: set(vars(module)) for name, module in model.named_modules()}


@pytest.mark.parametrize(
    "config",
    [
        {"compile": "default", "compile_scope": "blocks", "loss": "compiled"},
        {"activation_checkpointing": "selective", "micro_batches": 2},
        {"activation_checkpointing": "blocks", "checkpoint_share": 0.5},
    ],
    ids=["blocks-compiled-loss-compiled", "selective-micro-batches", "half-checkpointed"],
)
def test_a_run_of_a_decoder_leaves_every_module_as_a_fresh_ones(config: dict[str, object]) -> None:
    pytest.importorskip("transformers")
    torch._dynamo.reset()
    workload = load_workload("hf:causal-lm", "tiny", seed=0, model_args={"arch": "llama"})
    fresh = load_workload("hf:causal-lm", "tiny", seed=0, model_args={"arch": "llama"})
    run(workload, LoopConfig.from_dict(config), RunArgs(steps=2, warmup=1, windows=1))
    left = _keys(workload.model)
    expected = _keys(fresh.model)
    assert left.keys() == expected.keys()
    differing = {n: left[n] ^ expected[n] for n in left if left[n] != expected[n]}
    assert not differing, differing
