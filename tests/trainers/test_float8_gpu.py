"""Precision float8 on a GPU of compute capability 8.9 or later (H100, H200, L4): it converts the
eligible linears and keeps the head in bf16, trains within a loose tolerance of bf16 from the
same weights and data, composes with compilation (whole model and per block) and with the
whole-step CUDA graph, and gives the model back. Skipped without such a GPU or torchao.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from trainers import LoopConfig, RunArgs, RunResult, Workload, load_workload, run
from trainers.float8 import MIN_CAPABILITY, is_float8
from trainers.kept_code import keeping_compiled
from trainers.workloads import disable_dropout


def _capable() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= MIN_CAPABILITY


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _capable(), reason="needs a CUDA GPU of compute capability >= 8.9"),
]

pytest.importorskip("torchao.float8", reason="torchao is not installed")

STEPS = 20
FEED = {"num_streams": 2, "sync_mode": "event", "sync_interval": 5, "optimizer": "fused"}


def _workload() -> Workload:
    # transformer small: feed-forward 256 -> 1024 -> 256 in 2 + 2 layers (8 linears converted);
    # the head (256 -> 1000) and attention's out_proj stay in bf16.
    workload = load_workload("transformer", "small", seed=0)
    disable_dropout(workload.model)
    return workload


def _run(
    precision: str, config: LoopConfig, workload: Workload | None = None, warmup: int = 4
) -> RunResult:
    torch.cuda.empty_cache()
    args = RunArgs(
        steps=STEPS,
        warmup=warmup,
        windows=2,
        device="cuda",
        precision=precision,  # type: ignore[arg-type]
    )
    return run(workload or _workload(), config, args)


def _close(losses: list[float], reference: list[float]) -> None:
    """A loose tolerance: float8 rounds the converted matmuls' operands to 3 mantissa bits."""
    assert all(math.isfinite(x) for x in losses)
    assert losses[0] == pytest.approx(reference[0], rel=0.02)
    assert losses[-1] == pytest.approx(reference[-1], rel=0.1)
    assert losses[-1] < losses[0]  # it trains


def test_float8_converts_keeps_the_head_and_trains_like_bf16() -> None:
    workload = _workload()
    head_dtypes: set[torch.dtype] = set()
    kinds: set[str] = set()

    def on_head(module: nn.Module, args: object, output: torch.Tensor) -> None:
        # The FLOP count runs a forward of the plain model first (before the conversion): only
        # forwards under autocast, the run's, are the converted model's.
        if torch.is_autocast_enabled("cuda"):
            head_dtypes.add(output.dtype)
            kinds.add(type(workload.model.transformer.encoder.layers[0].linear1).__name__)

    handle = workload.model.head.register_forward_hook(on_head)
    fp8 = _run("float8", LoopConfig(**FEED), workload)
    handle.remove()
    bf16 = _run("bf16-autocast", LoopConfig(**FEED))
    report = fp8.float8
    assert report is not None and report["converted"] == 8 and report["linears"] == 15
    assert report["kept"]["head"] == "output head: its logits feed the loss"
    assert 0.5 < report["flop_share"] < 0.6, report["summary"]  # 53.4 % counted on a CPU
    # During the run: the feed-forward layers were torchao's, the head a bf16 nn.Linear.
    assert kinds == {"Float8Linear"} and head_dtypes == {torch.bfloat16}
    _close(fp8.losses, bf16.losses)
    assert fp8.losses != bf16.losses  # float8 is never bit-exact
    assert not any(is_float8(m) for m in workload.model.modules())
    assert "float8 matmuls, MFU against" in (fp8.to_dict()["mfu_note"] or "")


@pytest.mark.parametrize("scope", ["model", "blocks"])
def test_float8_composes_with_compilation(scope: str) -> None:
    eager = _run("float8", LoopConfig(**FEED))
    compiled = _run("float8", LoopConfig(compile="default", compile_scope=scope, **FEED))
    assert compiled.float8 is not None and compiled.float8["converted"] == 8
    assert not compiled.compile_unstable, compiled.compile_notes
    _close(compiled.losses, eager.losses)


def test_float8_inside_a_whole_step_cuda_graph() -> None:
    eager = _run("float8", LoopConfig(**FEED))
    graph = _run("float8", LoopConfig(cuda_graph=True, **FEED))
    assert graph.float8 is not None and graph.float8["converted"] == 8
    _close(graph.losses, eager.losses)


@pytest.mark.parametrize("scope", ["model", "blocks"])
def test_float8_compiled_inside_a_whole_step_cuda_graph_trains_as_without(scope: str) -> None:
    """The scale space's second stage tries a whole-step graph over the compiled float8 step
    (`tuner.search.spaces.staged`): captured, it converts the same linears and trains as the
    same compiled step launched one kernel at a time does."""
    plain = _run("float8", LoopConfig(compile="default", compile_scope=scope, **FEED))
    graph = _run(
        "float8", LoopConfig(compile="default", compile_scope=scope, cuda_graph=True, **FEED)
    )
    assert graph.float8 is not None and graph.float8["converted"] == 8
    assert not graph.compile_unstable, graph.compile_notes
    _close(graph.losses, plain.losses)


@pytest.mark.parametrize("scope", ["model", "blocks"])
def test_a_whole_step_graph_runs_the_code_its_leader_compiled(scope: str) -> None:
    """`trainers.keeps_code`: the scale space's graph trial follows its leader (the same step
    without the graph), and the final round takes turns between them. Each runs the code the
    first compiled, captured or launched kernel by kernel: none compiles again (on an H200 at
    the Qwen2-style shape, 2026-12-04, they compiled 45-52 s each from the disk cache)."""
    plain = LoopConfig(compile="default", compile_scope=scope, **FEED)  # type: ignore[arg-type]
    graph = plain.replace(cuda_graph=True, num_streams=1)
    first = _run("float8", plain)
    captured = _run("float8", graph)
    again = _run("float8", plain)
    recaptured = _run("float8", graph)
    assert first.compile_s > 0
    for kept in (captured, again, recaptured):
        assert kept.compile_s == 0.0 and kept.compile_kept_s == pytest.approx(first.compile_s)
        assert (kept.compile_cache_hits, kept.compile_cache_misses) == (0, 0)
        assert not any("kept code dropped" in note for note in kept.compile_notes)
        assert not kept.compile_unstable, kept.compile_notes
    _close(captured.losses, first.losses)
    _close(recaptured.losses, captured.losses)


@pytest.mark.models
def test_float8_on_a_llama_style_decoder() -> None:
    pytest.importorskip("transformers")
    args = {"arch": "llama", "hidden": "512", "layers": "4", "heads": "8", "kv_heads": "2"}
    args |= {"vocab": "8192", "seq": "256", "batch": "8", "batches": "4"}

    def llama() -> Workload:
        workload = load_workload("hf:causal-lm", "small", seed=0, model_args=args)
        disable_dropout(workload.model)
        return workload

    config = LoopConfig(compile="default", compile_scope="blocks", **FEED)
    fp8 = _run("float8", config, llama())
    bf16 = _run("bf16-autocast", config, llama())
    assert fp8.float8 is not None and fp8.float8["converted"] == 7 * 4
    assert list(fp8.float8["kept"]) == ["lm_head"]
    _close(fp8.losses, bf16.losses)


@pytest.mark.models
@pytest.mark.parametrize("scope", ["model", "blocks"])
def test_float8_on_a_gpt2_style_decoder_converts_its_conv1d_projections(scope: str) -> None:
    """GPT-2's projections are Hugging Face Conv1D modules, which torchao's recipe leaves in bf16:
    converted here (`trainers.float8.Float8Conv1D`), compiled either way, trains as bf16 does."""
    pytest.importorskip("transformers")
    args = {"arch": "gpt2", "hidden": "512", "layers": "4", "heads": "8", "kv_heads": "0"}
    args |= {"ffn": "2048", "vocab": "8192", "seq": "256", "batch": "8", "batches": "4"}

    def gpt2() -> Workload:
        workload = load_workload("hf:causal-lm", "small", seed=0, model_args=args)
        disable_dropout(workload.model)
        return workload

    config = LoopConfig(compile="default", compile_scope=scope, **FEED)
    fp8 = _run("float8", config, gpt2())
    bf16 = _run("bf16-autocast", config, gpt2())
    # Four Conv1D a layer (attention's c_attn and c_proj, the MLP's c_fc and c_proj).
    assert fp8.float8 is not None and fp8.float8["converted"] == 4 * 4
    assert list(fp8.float8["kept"]) == ["lm_head"]
    _close(fp8.losses, bf16.losses)


def test_the_gate_judges_compiled_float8_against_bf16s_seed_to_seed_envelope() -> None:
    """The cross-precision gate as a tuning job runs it (`tuner.search.gating.gate.run_parts`): the
    bf16 reference and 4 other seeds under the process's own kernels, 60 steps judged for
    equivalence, the loop twin's bits (the config's loop settings on the reference's bf16
    arithmetic) over the first 10. The config's own run is owed no bits (`TWIN_KIND` "loop"), so
    it computes as the reference does, under the process's own settings, as its trial did."""
    from tuner.search.gating.gate import CrossPrecision, run_parts

    config = LoopConfig(compile="default", **FEED)
    run = run_parts(
        "transformer",
        "small",
        config,
        RunArgs(steps=10, seed=0, device="cuda", precision="bf16-autocast"),
        envelope=None,
        config_precision="float8",
        cross=CrossPrecision(steps=60),
    )
    verdict = run.verdict
    assert verdict.passed, verdict.reason
    assert (verdict.precision, verdict.reference_precision) == ("float8", "bf16-autocast")
    assert (verdict.steps, verdict.exact_steps) == (60, 10)
    assert (verdict.determinism, verdict.reference_determinism) == ("off", "off")
    assert run.envelope["spread"] == "seeds" and run.envelope["strict"] is False
    assert verdict.max_abs_deviation > 0.0  # float8 is never bf16 bit for bit


def test_float8_and_bf16_taking_turns_keep_their_code_side_by_side() -> None:
    """`trainers.kept_code.keeping_compiled`, as the tuner's final round takes turns between
    a float8 config and one of other arithmetic: each compiles once, and on its next turn
    Dynamo's guards pick its own entries (float8's converted linears, or bf16's plain ones).
    The whole model only: this model's blocks are torch.nn's own layers, which per block
    compiled nothing in bf16 (one H200, 2026-12-01) until each was compiled from a frame of
    ours (`trainers.recompute`); not run per block on a GPU since."""
    config = LoopConfig(compile="default", **FEED)  # type: ignore[arg-type]
    with keeping_compiled(2):
        turns = [_run(p, config) for p in ("float8", "bf16-autocast", "float8", "bf16-autocast")]
    first_a, first_b, again_a, again_b = turns
    assert first_b.compile_kept_s == 0.0  # compiled beside float8's entries, none kept for it
    for first, again in ((first_a, again_a), (first_b, again_b)):
        assert first.compile_s > 0
        assert again.compile_s == 0.0 and again.compile_kept_s == pytest.approx(first.compile_s)
        assert (again.compile_cache_hits, again.compile_cache_misses) == (0, 0)
        assert again.losses == pytest.approx(first.losses, rel=1e-3)
    assert again_a.float8 is not None and again_b.float8 is None
    assert again_a.losses != again_b.losses  # float8 is never bf16 bit for bit


@pytest.mark.parametrize("scope", ["model", "blocks"])
def test_a_copy_of_the_build_keeps_the_float8_compiled_code(scope: str) -> None:
    """`trainers.compilation.reuse_key` on float8, whose conversion swaps the linears for new
    modules each run: a second run on another copy of the build, and with other loop settings,
    compiles nothing, and the first run's model is not held by what Dynamo keeps."""
    import gc
    import weakref

    config = LoopConfig(compile="default", compile_scope=scope, **FEED)  # type: ignore[arg-type]
    first_workload = _workload()
    first = _run("float8", config, first_workload)
    gone = weakref.ref(first_workload.model)
    del first_workload
    again = _run("float8", config.replace(num_streams=1, sync_interval=1))
    assert first.compile_s > 0 and first.compile_kept_s == 0.0
    assert again.compile_s == 0.0 and again.compile_kept_s == pytest.approx(first.compile_s)
    assert (again.compile_cache_hits, again.compile_cache_misses) == (0, 0)
    # The same weights and data through the same graphs (bits may differ: atomics, no strict mode).
    assert again.losses == pytest.approx(first.losses, rel=1e-3)
    gc.collect()
    assert gone() is None


def test_the_float8_probes_between_two_runs_leave_the_first_runs_code_kept() -> None:
    """The search stages `float8_linears` and `float8_head` after a float8 trial, and their
    probes compile each linear shape and the head on its own (`trainers.kept_code.compile_apart`):
    the trial's code stays kept, so the next run of its config (the gate's run, a final-round
    turn) compiles nothing. On an H200 (2026-12-02) the float8_linears probe reset Dynamo, and
    the leader compiled again in the gate (166 s) and in the final round (47 s)."""
    from trainers import probe_levers

    config = LoopConfig(compile="default", **FEED)  # type: ignore[arg-type]
    workload = _workload()
    with keeping_compiled(2):
        first = _run("float8", config, workload)
        probed = probe_levers(
            _workload(),
            ["float8_linears", "float8_head"],
            device=torch.device("cuda"),
            precision="float8",
        )
        again = _run("float8", config.replace(num_streams=1))
    assert all(isinstance(v, float) for v in probed["float8_linears"].values()), probed
    assert first.compile_s > 0
    assert again.compile_s == 0.0 and again.compile_kept_s == pytest.approx(first.compile_s)
    assert not any("kept code dropped" in note for note in again.compile_notes)
