"""Model FLOPs and MFU (`trainers.flops`): the count against a hand count, the peak table, and
the utilisation figure's arithmetic and refusals."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from trainers.flops import (
    PEAKS,
    count_step_flops,
    first_batch,
    peak_column,
    peak_for,
    utilisation,
)
from trainers.workloads import load_workload
from trainers.workloads.base import SyntheticBatches, Workload
from trainers.workloads.mlp import classification_loss


def _mlp_workload(widths: list[int], batch: int) -> Workload:
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(widths):
        layers += [nn.Linear(a, b), nn.ReLU()]
    model = nn.Sequential(*layers[:-1])
    x = torch.randn(2, batch, widths[0])
    y = torch.randint(0, widths[-1], (2, batch))
    return Workload(
        name=f"mlp-{'x'.join(map(str, widths))}",
        preset=str(batch),
        model=model,
        dataset=SyntheticBatches((x, y)),
        loss_fn=classification_loss,
        samples_per_batch=batch,
    )


def test_the_count_of_an_mlp_step_is_the_hand_count() -> None:
    widths, batch = [24, 40, 16, 10], 12
    workload = _mlp_workload(widths, batch)
    # Each Linear: 2*B*in*out forward, the same again for the weight's gradient, and for the
    # input's gradient, except the first layer, whose input needs none.
    pairs = list(itertools.pairwise(widths))
    hand = sum(6 * batch * a * b for a, b in pairs) - 2 * batch * pairs[0][0] * pairs[0][1]
    assert count_step_flops(workload, torch.device("cpu")) == hand


class _Attention(nn.Module):
    """One causal self-attention layer through `scaled_dot_product_attention`, as Hugging Face
    decoders call it: q, k, v and output projections without bias."""

    def __init__(self, hidden: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.size = heads, kv_heads, hidden // heads
        self.qkv = nn.Linear(hidden, (heads + 2 * kv_heads) * self.size, bias=False)
        self.out = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(x).split(
            [self.heads * self.size, self.kv_heads * self.size, self.kv_heads * self.size], -1
        )
        q = q.view(b, s, self.heads, self.size).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, self.size).transpose(1, 2)
        v = v.view(b, s, self.kv_heads, self.size).transpose(1, 2)
        y = nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=self.kv_heads != self.heads
        )
        return self.out(y.transpose(1, 2).reshape(b, s, h))


def test_attention_is_counted_on_a_cpu_as_on_a_gpu() -> None:
    """On a CPU, `scaled_dot_product_attention` runs a kernel torch's FlopCounterMode has no
    formula for: the count must still hold attention's 4 x sequence^2 x hidden FLOPs forward (QK^T
    and AV, the causal mask not discounted) and twice that backward (no recomputed scores),
    besides the projections' 6 x rows x in x out (4 x for the first: its input needs no
    gradient)."""
    hidden, heads, seq, batch = 32, 4, 16, 3
    torch.manual_seed(0)
    kv_heads = heads
    model = _Attention(hidden, heads, kv_heads)
    x = torch.randn(2, batch, seq, hidden)

    def loss_fn(m: nn.Module, b: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return m(b[0]).float().pow(2).mean()

    workload = Workload(
        name="attention",
        preset="t",
        model=model,
        dataset=SyntheticBatches((x,)),
        loss_fn=loss_fn,
        samples_per_batch=batch,
    )
    rows = batch * seq
    qkv = (heads + 2 * kv_heads) * hidden // heads
    projections = 4 * rows * hidden * qkv + 6 * rows * hidden * hidden
    attention = 3 * batch * 4 * seq * seq * hidden
    assert count_step_flops(workload, torch.device("cpu")) == projections + attention


def test_grouped_query_attention_counts_every_query_head() -> None:
    """Llama's attention (32 query heads, 8 key/value heads, `enable_gqa`): torch 2.11's own
    formula refused such shapes, which ended a count on the 1.1B preset (H100, 2026-11-26)."""
    from trainers.flops import _attention_forward

    b, h, kv, s, d = 2, 32, 8, 128, 64
    assert _attention_forward((b, h, s, d), (b, kv, s, d), (b, kv, s, d)) == 4 * b * h * s * s * d
    assert (
        _attention_forward((b, h, s, d), (b, h, 2 * s, d), (b, h, 2 * s, d))
        == 8 * b * h * s * s * d
    )


def test_the_count_runs_where_the_model_is() -> None:
    """A comparison counts before its first run has moved the model to the GPU: the inputs go
    where the model is (here a device the model is not on: meta), and the count is the same."""
    widths, batch = [24, 40, 16, 10], 12
    on_cpu = count_step_flops(_mlp_workload(widths, batch), torch.device("cpu"))
    assert count_step_flops(_mlp_workload(widths, batch + 1), torch.device("meta")) == (
        on_cpu * (batch + 1) // batch
    )


def test_the_count_leaves_the_model_as_it_was() -> None:
    workload = load_workload("mlp", "tiny", seed=3)  # has dropout: the count must draw nothing
    model = workload.model
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.get_rng_state()
    count_step_flops(workload, torch.device("cpu"))
    assert model.training
    assert all(p.grad is None for p in model.parameters())
    assert torch.equal(torch.get_rng_state(), rng)
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key


def test_a_batchnorm_model_keeps_its_running_statistics() -> None:
    workload = load_workload("convnet", "tiny", seed=0)
    buffers = {k: v.clone() for k, v in workload.model.named_buffers()}
    assert count_step_flops(workload, torch.device("cpu")) > 0
    for key, value in workload.model.named_buffers():
        assert torch.equal(value, buffers[key]), key


def test_the_count_scales_with_the_batch() -> None:
    small = count_step_flops(_mlp_workload([8, 16, 4], 3), torch.device("cpu"))
    large = count_step_flops(_mlp_workload([8, 16, 4], 30), torch.device("cpu"))
    assert large == 10 * small


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H100 NVL", "H100 NVL"),
        ("NVIDIA H200", "H200 SXM"),
        ("NVIDIA A100-SXM4-80GB", "A100"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", None),
        ("NVIDIA GeForce RTX 4090", None),
        (None, None),
    ],
)
def test_the_peak_table_names_the_gpu(name: str | None, expected: str | None) -> None:
    peak = peak_for(name)
    assert (peak.name if peak else None) == expected


def test_every_peak_is_ordered_bf16_above_tf32() -> None:
    for peak in PEAKS:
        assert peak.bf16 > peak.tf32 > 0 and peak.fp32 > 0


@pytest.mark.parametrize(
    ("precision", "matmul", "column"),
    [
        ("bf16-autocast", "highest", "bf16"),
        ("fp16-autocast", "highest", "bf16"),
        ("tf32", "high", "tf32"),
        ("fp32", "highest", "fp32"),
        (None, "high", "tf32"),
        (None, "highest", "fp32"),
    ],
)
def test_the_precision_picks_the_peak(precision: str | None, matmul: str, column: str) -> None:
    assert peak_column(precision, matmul) == column


def test_utilisation_on_an_h100_in_bf16() -> None:
    # 494.7 TFLOP in one second is half the H100 SXM's dense bf16 peak.
    use = utilisation(
        int(494.7e12),
        1000.0,
        gpu_name="NVIDIA H100 80GB HBM3",
        precision="bf16-autocast",
        matmul_precision="highest",
    )
    assert use.tflops == pytest.approx(494.7)
    assert use.mfu == pytest.approx(0.5)
    assert use.peak_tflops == 989.4


def test_no_mfu_on_a_cpu_or_an_unknown_gpu_and_the_note_says_why() -> None:
    cpu = utilisation(10**9, 10.0, gpu_name=None, precision=None, matmul_precision="highest")
    assert cpu.mfu is None and cpu.tflops == pytest.approx(0.1)
    assert "CPU" in (cpu.note or "")
    other = utilisation(
        10**9, 10.0, gpu_name="Some GPU 9000", precision=None, matmul_precision="highest"
    )
    assert other.mfu is None and "Some GPU 9000" in (other.note or "")
    none = utilisation(None, 10.0, gpu_name="NVIDIA H100", precision=None, matmul_precision="high")
    assert none.mfu is None and none.tflops is None


class _Recording(nn.Module):
    """An MLP that records where each forward ran, and caches its last input, as some models
    cache what a forward computed."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second = nn.Linear(24, 40), nn.Linear(40, 10)
        self.ran_on: list[str] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.ran_on.append(x.device.type)
        self.cached = x
        return self.second(torch.relu(self.first(x)))


def _recording_workload(loss_fn: object = classification_loss) -> Workload:
    torch.manual_seed(0)
    x, y = torch.randn(2, 12, 24), torch.randint(0, 10, (2, 12))
    return Workload(
        name="recording",
        preset="12",
        model=_Recording(),
        dataset=SyntheticBatches((x, y)),
        loss_fn=loss_fn,  # type: ignore[arg-type]
        samples_per_batch=12,
    )


def test_the_count_runs_on_a_meta_copy_and_leaves_the_model_alone() -> None:
    """A real one-sample step of a 0.5B decoder took 38.5 s on a CPU before the first trial: the
    count reads shapes only, so it runs on a copy whose weights are meta tensors. It counts what
    the real step counts, and what a forward caches stays on the copy."""
    from trainers.flops import _count

    workload = _recording_workload()
    counted = count_step_flops(workload, torch.device("cpu"))
    model = workload.model
    assert isinstance(model, _Recording)
    assert model.ran_on == [] and not hasattr(model, "cached")  # the copy ran, on meta
    real = _count(workload, model, first_batch(workload), torch.device("cpu"))
    assert model.ran_on == ["cpu"]
    assert counted == real[""] > 0


def test_a_loss_that_reads_a_value_is_counted_for_real() -> None:
    """A loss that reads a value (`.item()`: a meta tensor has none) fails on the meta copy;
    the count then runs the real step, and counts the same."""

    def reading(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
        loss = classification_loss(model, batch)
        if loss.item() < 0:  # a value the meta copy cannot give
            raise AssertionError("a cross-entropy is never negative")
        return loss

    plain, reads = _recording_workload(), _recording_workload(reading)
    assert count_step_flops(reads, torch.device("cpu")) == count_step_flops(
        plain, torch.device("cpu")
    )
    assert isinstance(reads.model, _Recording) and reads.model.ran_on == ["cpu"]


@pytest.mark.parametrize("arch", ["gpt2", "llama", "qwen2", "gpt_neox", "mistral"])
def test_a_library_decoder_counts_on_meta_what_it_counts_for_real(arch: str) -> None:
    """Hugging Face decoders (tied embeddings, rotary caches, grouped-query attention): the meta
    copy's count equals the real step's, in total and linear by linear."""
    pytest.importorskip("transformers")
    from trainers.flops import _count
    from trainers.meta import meta_copy

    args = {"arch": arch} | ({"kv_heads": 2} if arch in {"llama", "mistral"} else {})
    workload = load_workload("hf:causal-lm", "tiny", seed=0, model_args=args)
    batch = first_batch(workload)
    meta = _count(workload, meta_copy(workload.model), batch, torch.device("meta"))
    assert meta == _count(workload, workload.model, batch, torch.device("cpu"))
    assert all(p.device.type == "cpu" for p in workload.model.parameters())
