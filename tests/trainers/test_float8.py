"""Precision float8 on the CPU: the validity rules (capability, divisibility, the head left in
bf16), the one-line refusals, the report of what was converted, and the conversion's place in
the loop core (before compilation, undone after the run).

torchao's float8 matmuls run on a CPU too (torch's CPU `_scaled_mm`), only not fast: the tests of
the core's wiring lift the device rule (`trainers.float8.device_error`, our own function) to run
the real conversion here. They skip without torchao (`pip install 'streamtune[float8]'`).
"""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from torch import nn

from trainers import ConfigError, LoopConfig, RunArgs, UnsupportedOnDevice, load_workload, run
from trainers import float8 as f8
from trainers.config import invalid_reason
from trainers.float8 import INSTALL, Float8Plan, capability_error, output_heads
from trainers.flops import count_step_flops_by_linear, utilisation

TRANSFORMER_CONVERTED = (
    "transformer.encoder.layers.0.linear1",
    "transformer.encoder.layers.0.linear2",
    "transformer.decoder.layers.0.linear1",
    "transformer.decoder.layers.0.linear2",
)


def test_float8_on_a_cpu_is_refused_in_one_line_without_importing_torchao() -> None:
    # A fresh interpreter: whether torchao was imported must not depend on the other tests.
    code = (
        "import sys, trainers\n"
        "w = trainers.load_workload('transformer', 'tiny', seed=0)\n"
        "try:\n"
        "    args = trainers.RunArgs(steps=2, warmup=0, windows=1, device='cpu', "
        "precision='float8')\n"
        "    trainers.run(w, trainers.LoopConfig(), args)\n"
        "except trainers.UnsupportedOnDevice as exc:\n"
        "    print(exc)\n"
        "print('torchao' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    message, imported = done.stdout.strip().splitlines()
    assert message == (
        "precision='float8': float8 matmuls need a CUDA GPU of compute capability 8.9 or later "
        "(H100, H200, L4, RTX 40xx); this run's device is cpu"
    )
    assert imported == "False"
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    ("gpu", "capability", "refused"),
    [
        ("NVIDIA A100-SXM4-80GB", (8, 0), True),
        ("NVIDIA GeForce RTX 3090", (8, 6), True),
        ("Tesla V100-SXM2-16GB", (7, 0), True),
        ("NVIDIA L4", (8, 9), False),
        ("NVIDIA H100 80GB HBM3", (9, 0), False),
        ("NVIDIA B200", (10, 0), False),
    ],
)
def test_the_capability_rule_names_the_gpu_its_capability_and_the_need(
    gpu: str, capability: tuple[int, int], refused: bool
) -> None:
    reason = capability_error(gpu, capability)
    if not refused:
        assert reason is None
        return
    assert reason is not None and "\n" not in reason
    major, minor = capability
    assert reason.startswith(f"precision='float8': {gpu} has compute capability {major}.{minor}")
    assert "8.9 or later" in reason and "use bf16-autocast" in reason


def test_without_torchao_the_refusal_gives_the_install_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A None entry in sys.modules makes `import torchao` fail as on an install without it.
    monkeypatch.setitem(sys.modules, "torchao", None)
    monkeypatch.setitem(sys.modules, "torchao.float8", None)
    reason = f8.torchao_error()
    assert reason is not None and "\n" not in reason
    assert reason.startswith("precision='float8' needs torchao 0.18")
    assert reason.endswith(INSTALL) and INSTALL == "pip install 'streamtune[float8]'"
    # On a CPU the device is what is wrong: nothing to install would help.
    assert (f8.unavailable(torch.device("cpu")) or "").endswith("this run's device is cpu")
    monkeypatch.setattr(f8, "device_error", lambda device: None)
    assert f8.unavailable(torch.device("cpu")) == reason
    workload = load_workload("transformer", "tiny", seed=0)
    with pytest.raises(UnsupportedOnDevice, match=r"pip install 'streamtune\[float8\]'"):
        run(
            workload,
            LoopConfig(),
            RunArgs(steps=2, warmup=0, windows=1, device="cpu", precision="float8"),
        )


class Shapes(nn.Module):
    """Linears of every kind the rules tell apart, the head named lm_head and registered first."""

    def __init__(self) -> None:
        super().__init__()
        self.lm_head = nn.Linear(32, 48)
        self.up = nn.Linear(32, 64)  # converted
        self.odd_out = nn.Linear(64, 24)  # 24 is no multiple of 16
        self.odd_in = nn.Linear(24, 32)  # nor as in_features
        self.attention = nn.MultiheadAttention(32, 2)  # out_proj: a subclass of nn.Linear
        self.last = nn.Linear(32, 16)  # the last Linear: an output head too


def test_the_plan_converts_only_plain_linears_of_multiples_of_16_and_never_the_head() -> None:
    model = Shapes()
    assert output_heads(model) == {"lm_head", "last"}
    plan = Float8Plan.of(model)
    assert plan.converted == ("up",)
    kept = dict(plan.kept)
    assert set(kept) == {"lm_head", "odd_out", "odd_in", "attention.out_proj", "last"}
    assert kept["lm_head"] == kept["last"] == "output head: its logits feed the loss"
    assert kept["odd_out"].startswith("64 x 24: in and out features must be multiples of 16")
    assert kept["odd_in"].startswith("24 x 32")
    assert kept["attention.out_proj"].startswith("NonDynamicallyQuantizableLinear is a subclass")
    # torchao's module_filter_fn takes (module, qualified name).
    assert plan.module_filter(model.up, "up") and not plan.module_filter(model.last, "last")


def test_the_report_counts_the_converted_share_of_the_step_flops() -> None:
    workload = load_workload("transformer", "tiny", seed=0)
    plan = Float8Plan.of(workload.model)
    assert plan.converted == TRANSFORMER_CONVERTED
    flops = count_step_flops_by_linear(workload, torch.device("cpu"))
    report = plan.report(flops)
    # Each feed-forward linear of tiny (32 -> 64, 64 -> 32; 8 sequences of 8 tokens): forward
    # 2 x 64 x 32 x 64 FLOPs, backward twice that (input and weight gradients).
    per_linear = 3 * 2 * 64 * 32 * 64
    assert report.converted_flops == 4 * per_linear
    assert report.step_flops == flops[""] > report.converted_flops
    assert report.flop_share == pytest.approx(4 * per_linear / flops[""])
    assert report.linears == 8 and len(report.converted) == 4
    assert report.summary().startswith(
        f"float8 (tensorwise): 4 of 8 linears converted, {report.flop_share:.1%} of the step's "
        "FLOPs; kept in bf16: 3 layers (NonDynamicallyQuantizableLinear is a subclass"
    )
    assert report.summary().endswith("head (output head: its logits feed the loss)")
    assert report.to_dict()["converted"] == 4 and report.to_dict()["flop_share"] > 0
    assert plan.report(None).flop_share is None


@pytest.mark.models
def test_the_rules_on_a_tiny_llama() -> None:
    pytest.importorskip("transformers")
    workload = load_workload("hf:causal-lm", "tiny", seed=0, model_args={"arch": "llama"})
    plan = Float8Plan.of(workload.model)
    layers = len(workload.model.model.layers)
    projections = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    assert plan.converted == tuple(
        f"model.layers.{i}.{part}.{name}"
        for i in range(layers)
        for part, names in (("self_attn", projections[:4]), ("mlp", projections[4:]))
        for name in names
    )
    # The head stays in bf16. Its vocabulary (128) equals the SwiGLU width of this preset: the
    # rule is "the head", not "out_features equal to the vocabulary", so gate_proj converts.
    assert dict(plan.kept) == {"lm_head": "output head: its logits feed the loss"}
    assert workload.model.model.layers[0].mlp.gate_proj.out_features == 128
    report = plan.report(count_step_flops_by_linear(workload, torch.device("cpu")))
    assert report.flop_share is not None and 0.0 < report.flop_share < 1.0

    # A feed-forward width that is no multiple of 16 keeps the MLP in bf16, attention converts.
    odd = load_workload("hf:causal-lm", "tiny", seed=0, model_args={"arch": "llama", "ffn": "40"})
    odd_plan = Float8Plan.of(odd.model)
    assert len(odd_plan.converted) == 4 * layers
    assert all(".self_attn." in name for name in odd_plan.converted)
    kept = dict(odd_plan.kept)
    assert kept["model.layers.0.mlp.gate_proj"].startswith("32 x 40: in and out features")
    assert kept["model.layers.0.mlp.down_proj"].startswith("40 x 32")


def test_float8_mfu_is_quoted_against_the_dense_bf16_peak() -> None:
    bf16 = utilisation(
        int(494.7e12),
        1000.0,
        gpu_name="NVIDIA H100 80GB HBM3",
        precision="bf16-autocast",
        matmul_precision="highest",
    )
    fp8 = utilisation(
        int(494.7e12),
        1000.0,
        gpu_name="NVIDIA H100 80GB HBM3",
        precision="float8",
        matmul_precision="highest",
    )
    assert fp8.mfu == bf16.mfu == pytest.approx(0.5) and fp8.peak_tflops == 989.4
    assert fp8.note == "float8 matmuls, MFU against the H100 SXM dense bf16 peak, 989.4 TFLOP/s"


@pytest.fixture
def float8_here(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchao, and float8 allowed on this CPU (the device rule is ours; torch's CPU
    `_scaled_mm` computes what the GPU's does, slowly)."""
    pytest.importorskip("torchao.float8", reason=f"torchao is not installed: {INSTALL}")
    monkeypatch.setattr(f8, "device_error", lambda device: None)


@pytest.mark.usefixtures("float8_here")
def test_a_float8_run_converts_reports_and_gives_the_model_back() -> None:
    workload = load_workload("transformer", "tiny", seed=0)
    model = workload.model
    before = dict(model.named_modules())
    params = list(model.parameters())
    result = run(
        workload,
        LoopConfig(),
        RunArgs(steps=6, warmup=0, windows=1, device="cpu", precision="float8"),
    )
    report = result.float8
    assert report is not None and report["converted"] == 4
    assert report["converted_names"] == list(TRANSFORMER_CONVERTED)
    assert report["kept"]["head"] == "output head: its logits feed the loss"
    assert 0.0 < report["flop_share"] < 1.0 and result.to_dict()["float8"] == report
    assert all(math.isfinite(loss) for loss in result.losses)
    # Given back: the very modules and Parameters it had, and it trained those.
    assert dict(model.named_modules()) == before and list(model.parameters()) == params
    assert not any(f8.is_float8(m) for m in model.modules())

    bf16 = run(
        load_workload("transformer", "tiny", seed=0),
        LoopConfig(),
        RunArgs(steps=6, warmup=0, windows=1, device="cpu", precision="bf16-autocast"),
    )
    assert bf16.float8 is None
    # Same weights and data; float8 rounds the converted matmuls' operands: never bit-exact,
    # and close (the first step's loss, before any update, within 1 %).
    assert result.losses != bf16.losses
    assert result.losses[0] == pytest.approx(bf16.losses[0], rel=0.01)


@pytest.mark.usefixtures("float8_here")
def test_float8_converts_before_the_blocks_are_compiled() -> None:
    workload = load_workload("transformer", "tiny", seed=0)
    config = LoopConfig(compile="default", compile_scope="blocks")
    seen: list[str] = []

    def hook(module: nn.Module, args: object) -> None:
        seen.append(type(module.linear1).__name__)  # type: ignore[union-attr]

    block = workload.model.transformer.encoder.layers[0]
    handle = block.register_forward_pre_hook(hook)
    result = run(
        workload, config, RunArgs(steps=2, warmup=1, windows=1, device="cpu", precision="float8")
    )
    handle.remove()
    assert result.float8 is not None and result.float8["converted"] == 4
    # The compiled block ran the converted layer; afterwards the block is plain again.
    assert seen and set(seen) == {"Float8Linear"}
    assert type(block.linear1) is nn.Linear and block._compiled_call_impl is None


@pytest.mark.usefixtures("float8_here")
def test_a_model_with_nothing_to_convert_is_refused_and_left_alone() -> None:
    workload = load_workload("convnet", "tiny", seed=0)  # its only Linear is the head
    with pytest.raises(ConfigError, match=r"^precision='float8' is invalid: allowed a model with"):
        run(
            workload,
            LoopConfig(),
            RunArgs(steps=2, warmup=0, windows=1, device="cpu", precision="float8"),
        )
    assert not any(f8.is_float8(m) for m in workload.model.modules())


@pytest.mark.usefixtures("float8_here")
def test_a_refused_block_lever_leaves_no_converted_layer_behind() -> None:
    workload = load_workload("mlp", "tiny", seed=0)  # no repeated blocks
    config = LoopConfig(activation_checkpointing="blocks")
    with pytest.raises(ConfigError, match="activation_checkpointing"):
        run(
            workload,
            config,
            RunArgs(steps=2, warmup=0, windows=1, device="cpu", precision="float8"),
        )
    assert not any(f8.is_float8(m) for m in workload.model.modules())


def test_float8_under_fsdp2_is_refused_until_a_gpu_test_passes_it() -> None:
    reason = invalid_reason({"parallel": "fsdp2"}, precision="float8")
    assert reason is not None and reason.startswith("precision='float8' is invalid: allowed ")
    assert "parallel='fsdp2'" in reason
    assert invalid_reason({"parallel": "ddp"}, precision="float8") is None
    assert invalid_reason({"parallel": "fsdp2"}, precision="bf16-autocast") is None


@pytest.mark.models
@pytest.mark.usefixtures("float8_here")
def test_a_conv1d_runs_torchaos_float8_matmul_on_its_own_parameters() -> None:
    """Hugging Face's Conv1D (GPT-2's projections) converts: the same float8 arithmetic as a
    Float8Linear given the transposed weight, its gradients on the Conv1D's own Parameters."""
    Conv1D = pytest.importorskip("transformers.pytorch_utils").Conv1D
    from torchao.float8 import Float8LinearConfig
    from torchao.float8.float8_linear import Float8Linear

    torch.manual_seed(0)
    conv = Conv1D(48, 32)  # nf (out), nx (in): weight 32 x 48
    nn.init.normal_(conv.bias)
    linear = nn.Linear(32, 48)
    with torch.no_grad():
        linear.weight.copy_(conv.weight.t())
        linear.bias.copy_(conv.bias)
    assert f8.is_conv1d(conv) and not f8.is_conv1d(linear)
    assert f8.linear_dims(conv) == (32, 48) == f8.linear_dims(linear)
    config = Float8LinearConfig.from_recipe_name(f8.RECIPE)
    converted = f8._float8_conv1d(conv, config)
    reference = Float8Linear.from_float(linear, config)
    assert f8.is_float8(converted) and converted.weight is conv.weight
    assert converted.bias is conv.bias
    x = torch.randn(2, 5, 32, requires_grad=True)
    y = x.detach().clone().requires_grad_(True)
    with torch.autocast("cpu", torch.bfloat16):
        out, expected = converted(x), reference(y)
    assert out.dtype == expected.dtype == torch.bfloat16 and out.shape == (2, 5, 48)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    # Not what bf16 gives: the operands were rounded to float8.
    with torch.autocast("cpu", torch.bfloat16):
        assert not torch.equal(out, conv(x))
    out.float().square().sum().backward()
    expected.float().square().sum().backward()
    assert conv.weight.grad is not None and conv.weight.grad.shape == (32, 48)
    assert linear.weight.grad is not None
    torch.testing.assert_close(conv.weight.grad, linear.weight.grad.t(), rtol=0, atol=0)
    torch.testing.assert_close(x.grad, y.grad, rtol=0, atol=0)
    # Converted, a Conv1D is an nn.Linear subclass, still no output head: a model of Conv1D only
    # (a bare GPT2Model) has none before or after.
    holder = nn.Sequential(Conv1D(48, 32))
    plan = Float8Plan.of(holder)
    assert plan.converted == ("0",) and output_heads(holder) == set()
    undo = f8.convert(holder, plan)
    assert f8.is_float8(holder[0]) and output_heads(holder) == set()
    undo()
    assert f8.is_conv1d(holder[0])


@pytest.mark.models
@pytest.mark.usefixtures("float8_here")
def test_a_gpt2_trains_in_float8_and_gets_its_conv1d_modules_back() -> None:
    """A torchao recipe converts nothing of GPT-2 but its head, which it keeps: here each Conv1D
    converts, the run trains, and the very modules and Parameters come back."""
    pytest.importorskip("transformers")
    model_args = {"arch": "gpt2", "hidden": "32", "ffn": "128"}
    workload = load_workload("hf:causal-lm", "tiny", seed=0, model_args=model_args)
    model = workload.model
    convs = [name for name, m in model.named_modules() if f8.is_conv1d(m)]
    assert convs and not any(
        isinstance(m, nn.Linear) for n, m in model.named_modules() if n in convs
    )
    plan = Float8Plan.of(model)
    assert plan.converted == tuple(convs)
    assert [name for name, _ in plan.kept] == ["lm_head"]
    before, params = dict(model.named_modules()), list(model.parameters())
    args = RunArgs(steps=4, warmup=0, windows=1, device="cpu", precision="float8")
    result = run(workload, LoopConfig(), args)
    report = result.float8
    assert report is not None and report["converted_names"] == convs
    assert 0.0 < report["flop_share"] < 1.0
    assert all(math.isfinite(loss) for loss in result.losses)
    assert dict(model.named_modules()) == before and list(model.parameters()) == params
    assert not any(f8.is_float8(m) for m in model.modules())
    bf16 = run(
        load_workload("hf:causal-lm", "tiny", seed=0, model_args=model_args),
        LoopConfig(),
        args.replace(precision="bf16-autocast"),
    )
    assert result.losses != bf16.losses
    assert result.losses[0] == pytest.approx(bf16.losses[0], rel=0.01)
