"""The `float8_linears` lever (`trainers/levers/float8_linears.py`), declared in its module alone:
LoopConfig, the API and `--fix` take it, a CPU and another precision refuse it in one line
before anything runs, a model where the value keeps nothing in float8 or puts nothing back is
refused before a search enqueues it; its effect (on a CPU, with torchao's conversion) puts the
small converted linears back in bf16 on their own Parameters and gives the float8 ones back; on
a float8-capable GPU a run trains with only the large ones in float8."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from tests.lever_entry import accepted
from trainers import (
    LEVERS,
    ConfigError,
    LoopConfig,
    RunArgs,
    UnsupportedOnDevice,
    invalid_reason,
    load_workload,
    run,
)
from trainers import float8 as f8
from trainers.gate import required_test
from trainers.levers import float8_linears
from trainers.levers.declare import ProbeInput
from trainers.levers.float8_linears import FLOAT8_LINEARS
from trainers.levers.timing import graphed
from tuner.search.spaces.named import load_space, without_precision_refusals
from tuner.search.spaces.space import Choice, config_key

LARGE = {"float8_linears": "8M"}


def _meta(*dims: tuple[int, int]) -> nn.Sequential:
    """Linears of these (in, out) on the meta device (their weights never allocated); the last
    is the output head."""
    return nn.Sequential(*(nn.Linear(i, o, device="meta") for i, o in dims))


def test_it_is_declared_once_and_validated_by_loop_config() -> None:
    lever = LEVERS["float8_linears"]
    assert lever is FLOAT8_LINEARS
    assert lever.values() == ("all", "4M", "8M", "none") and lever.default == "all"
    assert lever.unconverted == "none"  # what the second stage predicts a move into float8 by
    assert LoopConfig().get("float8_linears") == "all"
    assert LoopConfig.from_dict(LARGE).get("float8_linears") == "8M"
    with pytest.raises(ConfigError, match="float8_linears='16M' is invalid: allowed one of all"):
        LoopConfig.from_dict({"float8_linears": "16M"})
    # A stored config keeps its key: the lever at its default is left out of it.
    assert config_key(LoopConfig()) == "53b15d1b156a"
    assert config_key(LoopConfig.from_dict(LARGE)) != "53b15d1b156a"
    # It changes the arithmetic: the gate owes it equivalence, never bits.
    assert required_test(LoopConfig.from_dict(LARGE)) == "equivalence"


def test_the_api_and_the_cli_take_the_same_values_and_the_spaces_offer_8m() -> None:
    for value, allowed in (("8M", True), ("4M", True), ("all", True), ("16M", False)):
        api, cli = accepted("float8_linears", value)
        assert api is cli is allowed, value
    for name in ("full", "scale"):
        offered = load_space(name).params["float8_linears"]
        assert offered == Choice(values=("all", "8M", "none")), name
        # A study that never runs float8 leaves it out, without a note (its default alone).
        narrowed = without_precision_refusals(load_space(name), ("bf16-autocast",))
        assert "float8_linears" not in narrowed.params and "float8_linears" not in narrowed.fixed
        assert narrowed.notes == load_space(name).notes


def test_a_cpu_refuses_it_in_one_line_before_anything_runs() -> None:
    workload = load_workload("mlp", "tiny", seed=0)
    before = {k: v.clone() for k, v in workload.model.state_dict().items()}
    with pytest.raises(UnsupportedOnDevice) as caught:
        run(workload, LoopConfig.from_dict(LARGE), RunArgs(steps=2, windows=1, device="cpu"))
    message = str(caught.value)
    assert "float8_linears='8M'" in message and "cpu" in message and "\n" not in message
    after = workload.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_another_precision_refuses_it_before_anything_runs_and_before_a_search_enqueues_it() -> (
    None
):
    for precision in ("fp32", "bf16-autocast"):
        reason = invalid_reason(LARGE, precision=precision)
        assert reason is not None and "float8_linears='8M'" in reason and precision in reason
    assert invalid_reason(LARGE, precision="float8") is None
    assert invalid_reason({"float8_linears": "all"}, precision="fp32") is None


def test_a_model_where_the_value_changes_nothing_or_keeps_nothing_is_refused_in_one_line() -> None:
    """`refuse_for`, read without a GPU on the plan a float8 run would convert (the head never
    counts): a value must keep one linear in float8 and put one back, else it is `all` or bf16."""
    mixed = _meta((4096, 2048), (2048, 512), (512, 64))  # 8.4M kept, 1.0M back, the head
    assert invalid_reason(LARGE, precision="float8", model=mixed) is None
    small = _meta((2048, 2048), (2048, 512), (512, 64))  # 4.2M and 1.0M
    reason = invalid_reason(LARGE, precision="float8", model=small)
    assert reason is not None and "none of its float8 linears" in reason, reason
    assert "2048 x 2048" in reason and "\n" not in reason
    large = _meta((4096, 4096), (4096, 64))
    reason = invalid_reason(LARGE, precision="float8", model=large)
    assert reason is not None and "every float8 linear" in reason, reason
    # 4M keeps the 4M-element layer that 8M puts back.
    assert invalid_reason({"float8_linears": "4M"}, precision="float8", model=small) is None


HEAD_ALONE = {"float8_head": "float8", "float8_linears": "none"}


def test_none_keeps_the_head_alone_and_is_refused_beside_a_head_in_bf16_in_one_line() -> None:
    """`none` keeps no linear but the head in float8 (`float8_head`'s): beside a head kept in
    bf16 nothing would run in float8, so LoopConfig refuses it naming both levers; a model with
    linears of any size takes it (it puts every one back)."""
    for head in ("bf16", None):
        given = {"float8_linears": "none"} | ({"float8_head": head} if head else {})
        with pytest.raises(ConfigError) as caught:
            LoopConfig.from_dict(given)
        message = str(caught.value)
        assert "float8_linears='none'" in message and "float8_head='bf16'" in message
        assert "\n" not in message
    assert LoopConfig.from_dict(HEAD_ALONE).get("float8_linears") == "none"
    assert required_test(LoopConfig.from_dict(HEAD_ALONE)) == "equivalence"
    for dims in (((4096, 4096), (4096, 64)), ((2048, 512), (512, 64))):
        assert invalid_reason(HEAD_ALONE, precision="float8", model=_meta(*dims)) is None
    # A head float8 cannot take (GPT-2's vocabulary of 50,257 is no multiple of 16): refused
    # for the model, so a space leaves the value out.
    odd_head = _meta((2048, 512), (512, 50257))
    reason = FLOAT8_LINEARS.refuse_for and FLOAT8_LINEARS.refuse_for("none", odd_head)
    assert isinstance(reason, str) and "none keeps its head alone in float8" in reason, reason
    reason = invalid_reason(HEAD_ALONE, precision="bf16-autocast")
    assert reason is not None and "bf16-autocast" in reason


def test_none_puts_every_linear_but_the_head_back() -> None:
    pytest.importorskip("torchao.float8")
    model = nn.Sequential(nn.Linear(4096, 2048), nn.Linear(2048, 512), nn.Linear(512, 64))
    originals = list(model)
    report, undo_float8 = f8.apply_float8(model, flops={"": 100, "0": 60, "1": 10, "2": 5})
    assert LEVERS["float8_head"].transform is not None and FLOAT8_LINEARS.transform is not None
    # A run applies them in table order (`trainers.levers.declare.transformed`): the head's
    # first, since `none` leaves the head to it.
    assert list(LEVERS).index("float8_head") < list(LEVERS).index("float8_linears")
    undo_head = LEVERS["float8_head"].transform("float8", model)
    undo = FLOAT8_LINEARS.transform("none", model)
    assert model[0] is originals[0] and model[1] is originals[1] and f8.is_float8(model[2])
    after = report.after_levers(model, {"": 100, "0": 60, "1": 10, "2": 5})
    assert after.converted == ("2",) and after.converted_flops == 5
    undo()
    undo_head()
    undo_float8()
    assert list(model) == originals


def test_the_effect_puts_the_small_linears_back_on_their_parameters_and_gives_float8_back() -> None:
    """On a CPU with torchao's conversion, as `trainers.core.Engine` applies it: after the
    precision's conversion, the linears under the size become `nn.Linear` again on the very
    Parameters (the optimizer's), the head is left to `float8_head`, the report moves them to
    the kept ones, and the undo gives the float8 modules back."""
    pytest.importorskip("torchao.float8")
    model = nn.Sequential(nn.Linear(4096, 2048), nn.Linear(2048, 512), nn.Linear(512, 64))
    parameters = [id(p) for p in model.parameters()]
    original = model[1]
    report, undo_float8 = f8.apply_float8(model, flops={"": 100, "0": 60, "1": 10})
    assert report.converted == ("0", "1") and report.flop_share == 0.7
    converted = model[1]
    assert FLOAT8_LINEARS.transform is not None
    undo = FLOAT8_LINEARS.transform("8M", model)
    assert f8.is_float8(model[0]) and model[1] is original and type(model[2]) is nn.Linear
    assert model[1].weight is converted.weight and model[1].bias is converted.bias
    assert [id(p) for p in model.parameters()] == parameters
    assert len(list(converted.modules())) == 1  # the original is no submodule of the float8 one
    out = model[1](torch.randn(3, 2048))
    assert out.shape == (3, 512)
    after = report.after_levers(model, {"": 100, "0": 60, "1": 10})
    assert after.converted == ("0",) and after.flop_share == 0.6 and after.linears == 3
    assert dict(after.kept)["1"] == "put back in bf16 by float8_linears"
    assert "1 of 3 linears converted, 60.0% of the step's FLOPs" in after.summary()
    undo()
    assert model[1] is converted and report.after_levers(model, None) is report
    undo_float8()
    assert not any(f8.is_float8(m) for m in model.modules())


class Conv1D(nn.Module):
    """A model's own `Conv1D` (`x @ W + b`, W in x out, as GPT-2's), which float8 converts as it
    converts transformers' (`trainers.float8.is_conv1d`), transformers or not."""

    def __init__(self, nf: int, nx: int) -> None:
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)


def test_the_effect_puts_a_models_own_conv1d_back_and_the_report_counts_a_float8_head() -> None:
    """The module put back is the one the conversion replaced (its own class: no library is
    asked for one); with the head converted by `float8_head` first, the report counts the head
    with what runs in float8 and the layer put back with the kept ones."""
    pytest.importorskip("torchao.float8")
    model = nn.Module()
    model.c_fc = Conv1D(4096, 2048)  # 8.4M: kept in float8
    model.c_proj = Conv1D(512, 2048)  # 1.0M: put back
    model.lm_head = nn.Linear(512, 64)
    original = model.c_proj
    report, undo_float8 = f8.apply_float8(model, flops={"": 90, "c_fc": 50, "c_proj": 10})
    assert LEVERS["float8_head"].transform is not None and FLOAT8_LINEARS.transform is not None
    undo_head = LEVERS["float8_head"].transform("float8", model)
    undo = FLOAT8_LINEARS.transform("8M", model)
    assert model.c_proj is original and f8.is_float8(model.c_fc) and f8.is_float8(model.lm_head)
    after = report.after_levers(model, {"": 90, "c_fc": 50, "c_proj": 10, "lm_head": 20})
    assert set(after.converted) == {"c_fc", "lm_head"} and after.converted_flops == 70
    assert dict(after.kept) == {"c_proj": "put back in bf16 by float8_linears"}
    undo()
    undo_head()
    undo_float8()
    assert model.c_proj is original and type(model.c_fc) is Conv1D
    assert type(model.lm_head) is nn.Linear


@pytest.mark.models
def test_the_effect_puts_a_small_conv1d_back_as_a_conv1d() -> None:
    """GPT-2's projections: a `Float8Conv1D` under the size becomes a `Conv1D` again (its
    weight in x out, the same Parameter), which computes what it did before the conversion."""
    pytest.importorskip("torchao.float8")
    pytest.importorskip("transformers")
    from transformers.pytorch_utils import Conv1D

    model = nn.Module()
    model.c_fc = Conv1D(4096, 2048)  # nf (out), nx (in): 8.4M, kept
    model.c_proj = Conv1D(512, 2048)  # 1.0M, put back
    model.lm_head = nn.Linear(512, 64)
    inputs = torch.randn(3, 2048)
    expected = model.c_proj(inputs)
    undo_float8 = f8.apply_float8(model, flops=None)[1]
    assert FLOAT8_LINEARS.transform is not None
    undo = FLOAT8_LINEARS.transform("8M", model)
    assert type(model.c_proj) is Conv1D and f8.is_float8(model.c_fc)
    assert torch.equal(model.c_proj(inputs), expected)
    undo()
    undo_float8()
    assert type(model.c_proj) is Conv1D and type(model.c_fc) is Conv1D


def test_a_model_with_nothing_in_float8_refuses_its_effect_and_is_left_as_it_was() -> None:
    model = nn.Sequential(nn.Linear(4096, 2048), nn.Linear(2048, 512), nn.Linear(512, 64))
    kinds = [type(m) for m in model.modules()]
    assert FLOAT8_LINEARS.transform is not None
    with pytest.raises(ConfigError) as caught:
        FLOAT8_LINEARS.transform("8M", model)
    assert "unless the run's precision is float8" in str(caught.value)
    assert [type(m) for m in model.modules()] == kinds
    FLOAT8_LINEARS.transform("all", model)()  # the default changes nothing, and undoes nothing


def _probe(model: nn.Module, inputs: torch.Tensor, device: str) -> dict[Any, float | str]:
    where = ProbeInput(
        forward=lambda: model(inputs).sum(), device=torch.device(device), model=model
    )
    assert FLOAT8_LINEARS.probe is not None
    return FLOAT8_LINEARS.probe(where)


class _Twice(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.shared = nn.Linear(32, 32)
        self.other = nn.Linear(32, 64)
        self.lm_head = nn.Linear(64, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.other(self.shared(self.shared(x))))


def test_the_probe_counts_every_call_of_each_shape_on_its_rows() -> None:
    """A layer called twice a step runs its matmuls twice: both calls count."""
    model = _Twice()
    where = ProbeInput(
        forward=lambda: model(torch.randn(2, 8, 32)).sum(), device=torch.device("cpu"), model=model
    )
    shapes = float8_linears.converted_linears(model)
    assert shapes == {"shared": (32, 32, True), "other": (32, 64, True)}
    calls = float8_linears.sibling_calls(where, shapes)
    # Each call on an input of its own: three groups of one.
    assert calls == {(((32, 32, True),), 16): 2, (((32, 64, True),), 16): 1}
    assert not model.shared._forward_pre_hooks


class _Attention(nn.Module):
    """q, k and v read one input (one group); o reads their product, up reads o's output and
    gate the same (a second group); down reads a product made after the layer's inputs were
    freed, so an id Python gives again must not join it to an earlier group."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = nn.Linear(32, 32), nn.Linear(32, 16), nn.Linear(32, 16)
        self.o = nn.Linear(32, 32)
        self.gate, self.up = nn.Linear(32, 64, bias=False), nn.Linear(32, 64, bias=False)
        self.down = nn.Linear(64, 32, bias=False)
        self.lm_head = nn.Linear(32, 16)

    def block(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.q(x), self.k(x), self.v(x)
        attended = q * torch.cat([k, v], dim=-1)
        h = self.o(attended)
        return h + self.down(torch.relu(self.gate(h)) * self.up(h))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.block(self.block(x)))


def test_the_probe_groups_the_linears_that_read_one_input() -> None:
    """q/k/v form one group and gate/up another, each called twice (two blocks); o and down
    stand alone: the float8 casts of a shared input are timed once, as the model compiled
    runs them."""
    model = _Attention()
    where = ProbeInput(
        forward=lambda: model(torch.randn(2, 8, 32)).sum(), device=torch.device("cpu"), model=model
    )
    calls = float8_linears.sibling_calls(where, float8_linears.converted_linears(model))
    qkv = ((32, 32, True), (32, 16, True), (32, 16, True))
    assert calls == {
        (qkv, 16): 2,
        (((32, 32, True),), 16): 2,
        (((32, 64, False), (32, 64, False)), 16): 2,
        (((64, 32, False),), 16): 2,
    }


def test_on_a_cpu_a_group_is_timed_in_bf16_each_member_on_the_one_input() -> None:
    """A group all in bf16 runs eager here (float8 needs a GPU): every member reads the one
    input and gives its own output, and the step (forward and backward) is timed."""
    holder = float8_linears._Siblings([nn.Linear(32, 32), nn.Linear(32, 16)])
    outs = holder(torch.randn(16, 32))
    assert [tuple(o.shape) for o in outs] == [(16, 32), (16, 16)]
    group = ((32, 32, True), (32, 16, True))
    assert float8_linears.group_ms(group, 16, (False, False), torch.device("cpu"), iters=2) > 0


def test_on_a_cpu_the_probe_says_why_for_every_value_and_leaves_the_model() -> None:
    """Every value runs float8 matmuls: on a CPU each says why it cannot run (the second stage
    leaves such a value out); a model with nothing float8 converts has nothing to probe."""
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
    figures = _probe(model, torch.randn(4, 32), "cpu")
    assert set(figures) == {"all", "4M", "8M", "none"}
    assert all(isinstance(f, str) and "compute capability" in f for f in figures.values())
    assert not model[0]._forward_pre_hooks
    assert all(type(m) in (nn.Linear, nn.ReLU, nn.Sequential) for m in model.modules())
    odd = nn.Sequential(nn.Linear(10, 30), nn.Linear(30, 7))  # not 16s, and the head
    assert _probe(odd, torch.randn(4, 10), "cpu") == {}


def _capable() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= f8.MIN_CAPABILITY


@pytest.mark.gpu
@pytest.mark.models
@pytest.mark.skipif(not _capable(), reason="needs a CUDA GPU of compute capability >= 8.9")
@pytest.mark.parametrize("compile_scope", ["model", "blocks"])
def test_on_a_float8_gpu_only_the_mlp_runs_in_float8_and_the_model_comes_back(
    compile_scope: str,
) -> None:
    """A Llama-style decoder of llama-1b's widths (2 layers): at 8M its MLP (2048 x 8192, 16.8M)
    stays in float8, its attention's projections (4.2M and 1.0M) run in bf16; it trains."""
    pytest.importorskip("torchao.float8")
    pytest.importorskip("transformers")
    args = {"arch": "llama", "hidden": "2048", "layers": "2", "heads": "32", "kv_heads": "8"}
    args |= {"ffn": "8192", "vocab": "8192", "seq": "256", "batch": "8", "batches": "4"}
    workload = load_workload("hf:causal-lm", "small", seed=0, model_args=args)
    kinds: list[tuple[str, str]] = []
    loss_fn = workload.loss_fn
    layer = workload.model.model.layers[0]

    def observed(model: Any, batch: Any) -> Any:
        kinds.append((type(layer.self_attn.q_proj).__name__, type(layer.mlp.up_proj).__name__))
        return loss_fn(model, batch)

    workload.loss_fn = observed
    config = LoopConfig.from_dict({"compile": "default", "compile_scope": compile_scope, **LARGE})
    steps = RunArgs(steps=6, warmup=2, windows=1, device="cuda", precision="float8")
    result = run(workload, config, steps)
    assert kinds[-6:] == [("Linear", "Float8Linear")] * 6
    assert all(math.isfinite(x) for x in result.losses) and result.losses[-1] < result.losses[0]
    assert not any(f8.is_float8(m) for m in workload.model.modules())  # given back


@pytest.mark.gpu
@pytest.mark.skipif(not _capable(), reason="needs a CUDA GPU of compute capability >= 8.9")
def test_on_a_float8_gpu_the_probe_times_every_value_and_leaves_the_model() -> None:
    pytest.importorskip("torchao.float8")
    model = nn.Sequential(nn.Linear(2048, 4096), nn.Linear(4096, 512), nn.Linear(512, 64)).cuda()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    figures = _probe(model, torch.randn(4096, 2048, device="cuda"), "cuda")
    assert all(isinstance(figures[v], float) and figures[v] > 0 for v in ("all", "4M", "8M"))
    # 4M and 8M both put the 2.1M-element layer back: the same figure; none puts both back.
    assert figures["4M"] == figures["8M"] != figures["all"]
    assert isinstance(figures["none"], float) and figures["none"] not in (
        figures["all"],
        figures["8M"],
    )
    assert not any(f8.is_float8(m) for m in model.modules())
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.gpu
@pytest.mark.models
@pytest.mark.skipif(not _capable(), reason="needs a CUDA GPU of compute capability >= 8.9")
def test_on_a_float8_gpu_the_head_alone_runs_in_float8() -> None:
    """`none` beside the float8 head, the whole model compiled: every projection of a
    Qwen2-style decoder runs in bf16, its head in float8; it trains and comes back."""
    pytest.importorskip("torchao.float8")
    pytest.importorskip("transformers")
    args = {"arch": "qwen2", "hidden": "1024", "layers": "2", "heads": "16", "kv_heads": "16"}
    args |= {"ffn": "2816", "vocab": "32768", "seq": "256", "batch": "8", "batches": "4"}
    workload = load_workload("hf:causal-lm", "small", seed=0, model_args=args)
    kinds: list[tuple[str, str, str]] = []
    loss_fn = workload.loss_fn
    model = workload.model
    layer = model.model.layers[0]

    def observed(module: Any, batch: Any) -> Any:
        names = (layer.self_attn.q_proj, layer.mlp.up_proj, model.lm_head)
        kinds.append(tuple(type(m).__name__ for m in names))  # type: ignore[arg-type]
        return loss_fn(module, batch)

    workload.loss_fn = observed
    config = LoopConfig.from_dict({"compile": "default", "compile_scope": "model", **HEAD_ALONE})
    steps = RunArgs(steps=6, warmup=2, windows=1, device="cuda", precision="float8")
    result = run(workload, config, steps)
    assert kinds[-6:] == [("Linear", "Linear", "Float8Linear")] * 6
    assert all(math.isfinite(x) for x in result.losses) and result.losses[-1] < result.losses[0]
    assert not any(f8.is_float8(m) for m in workload.model.modules())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_a_step_is_captured_and_each_replay_runs_it_once() -> None:
    counted = torch.zeros((), device="cuda")

    def step() -> None:
        counted.add_(1)

    replay = graphed(step, torch.device("cuda"), warmup=2)
    assert replay is not step
    torch.cuda.synchronize()
    assert counted.item() == 2  # the warm-up's two: a capture runs nothing
    replay()
    replay()
    torch.cuda.synchronize()
    assert counted.item() == 4


@pytest.mark.gpu
@pytest.mark.skipif(not _capable(), reason="needs a CUDA GPU of compute capability >= 8.9")
@pytest.mark.parametrize("mix", [(False, False, False), (True, True, True), (True, False, False)])
def test_on_a_float8_gpu_the_probes_group_step_is_captured_whole(mix: tuple[bool, ...]) -> None:
    """Forward and backward of a probe's group (q/k/v-like: one input, three linears), in
    bf16, in float8 compiled together, and mixed, in one CUDA graph: the probe times the GPU's
    work, not the host's launches (a capture that fails falls back to the step as launched,
    which this would not tell from a capture)."""
    pytest.importorskip("torchao.float8")
    device = torch.device("cuda")
    group = ((1024, 1024, True), (1024, 256, True), (1024, 256, True))
    step = float8_linears.group_step(group, 4096, mix, device)
    assert graphed(step, device) is not step
    assert float8_linears.group_ms(group, 4096, mix, device, iters=2) > 0


def test_off_a_gpu_a_step_is_timed_as_it_is() -> None:
    def step() -> None:
        pass

    assert graphed(step, torch.device("cpu")) is step
