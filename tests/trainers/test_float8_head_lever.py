"""The `float8_head` lever (`trainers/levers/float8_head.py`), declared in its module alone:
LoopConfig, the API and `--fix` take it, a CPU refuses it in one line before anything runs, a
model with nothing converted to float8 refuses its effect in one line and is left as it was; on a
float8-capable GPU a run converts the head too and gives the model back, and a head whose
features float8 cannot take is refused."""

from __future__ import annotations

import contextlib
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
from trainers.float8 import MIN_CAPABILITY, is_float8
from trainers.gate import required_test
from trainers.levers.declare import ProbeInput
from trainers.levers.float8_head import FLOAT8_HEAD
from tuner.search.spaces.named import load_space, without_precision_refusals
from tuner.search.spaces.space import Choice, config_key

HEAD = {"float8_head": "float8"}


def test_it_is_declared_once_and_validated_by_loop_config() -> None:
    lever = LEVERS["float8_head"]
    assert lever is FLOAT8_HEAD
    assert lever.values() == ("bf16", "float8") and lever.default == "bf16"
    assert LoopConfig().get("float8_head") == "bf16"
    assert LoopConfig.from_dict(HEAD).get("float8_head") == "float8"
    with pytest.raises(ConfigError, match="float8_head='fp8' is invalid: allowed one of bf16"):
        LoopConfig.from_dict({"float8_head": "fp8"})
    # A stored config keeps its key: the lever at its default is left out of it.
    assert config_key(LoopConfig()) == "53b15d1b156a"
    assert config_key(LoopConfig.from_dict(HEAD)) != "53b15d1b156a"
    # It changes the arithmetic: the gate owes it equivalence, never bits.
    assert required_test(LoopConfig.from_dict(HEAD)) == "equivalence"


def test_the_api_and_the_cli_take_the_same_values() -> None:
    for value, allowed in (("float8", True), ("bf16", True), ("fp8", False)):
        api, cli = accepted("float8_head", value)
        assert api is cli is allowed, value
    # Offered (measured on a GPU, 2026-11-30): the built-in spaces search it on a GPU, and a
    # study that never runs float8 leaves it out (`without_precision_refusals`).
    for name in ("full", "scale"):
        assert load_space(name).params["float8_head"] == Choice(values=("bf16", "float8")), name
        narrowed = without_precision_refusals(load_space(name), ("bf16-autocast",))
        assert "float8_head" not in narrowed.params and "float8_head" not in narrowed.fixed
        assert narrowed.notes == load_space(name).notes  # its default alone: no note
        both = without_precision_refusals(load_space(name), ("bf16-autocast", "float8"))
        assert both == load_space(name)
    assert "float8_head" not in without_precision_refusals(load_space("scale"), ("fp32",)).params


def test_a_cpu_refuses_it_in_one_line_before_anything_runs() -> None:
    workload = load_workload("mlp", "tiny", seed=0)
    before = {k: v.clone() for k, v in workload.model.state_dict().items()}
    with pytest.raises(UnsupportedOnDevice) as caught:
        run(workload, LoopConfig.from_dict(HEAD), RunArgs(steps=2, windows=1, device="cpu"))
    message = str(caught.value)
    assert "float8_head='float8'" in message and "cpu" in message and "\n" not in message
    after = workload.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing trained


def test_a_model_with_nothing_in_float8_refuses_its_effect_and_is_left_as_it_was() -> None:
    """The effect alone, as `trainers.core.Engine` applies it after the precision's conversion:
    a bf16 run converted nothing, so the head would be the only float8 layer."""
    model = load_workload("mlp", "tiny", seed=0).model
    kinds = [type(m) for m in model.modules()]
    assert FLOAT8_HEAD.transform is not None
    with pytest.raises(ConfigError) as caught:
        FLOAT8_HEAD.transform("float8", model)
    assert "unless the run's precision is float8" in str(caught.value)
    assert [type(m) for m in model.modules()] == kinds
    FLOAT8_HEAD.transform("bf16", model)()  # the default changes nothing, and undoes nothing


def test_another_precision_refuses_it_before_anything_runs_and_before_a_search_enqueues_it() -> (
    None
):
    """`refuse_in`: what `invalid_reason` tells a search (its second stage leaves the variant out)
    and what the run's setup raises, in one line naming the lever and the precision."""
    for precision in ("fp32", "bf16-autocast"):
        reason = invalid_reason(HEAD, precision=precision)
        assert reason is not None and "float8_head='float8'" in reason and precision in reason
    assert invalid_reason(HEAD, precision="float8") is None
    assert invalid_reason({"float8_head": "bf16"}, precision="fp32") is None
    assert invalid_reason(HEAD) is None  # no precision given: nothing to say yet
    workload = load_workload("mlp", "tiny", seed=0)
    args = RunArgs(steps=2, windows=1, device="cpu", precision="bf16-autocast")
    with pytest.raises(ConfigError) as caught:
        run(workload, LoopConfig.from_dict({"float8_head": "float8"}), args)
    assert caught.value.field == "float8_head" and "bf16-autocast" in str(caught.value)


def test_a_head_float8_cannot_take_is_refused_before_a_search_enqueues_it() -> None:
    """`refuse_for`, read without a GPU: the transformer's head is 256 -> 1000, not 16s."""
    model = load_workload("transformer", "small", seed=0).model
    reason = invalid_reason(HEAD, precision="float8", model=model)
    assert reason is not None and "1000" in reason and "multiples of 16" in reason, reason
    convertible = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 64))
    assert invalid_reason(HEAD, precision="float8", model=convertible) is None


def _head_probe(
    model: nn.Module, inputs: torch.Tensor, device: str, autocast: Any = contextlib.nullcontext
) -> dict[Any, float | str]:
    def forward() -> object:
        with autocast():  # as `trainers.probe_levers` runs the forward: in the run's autocast
            return model(inputs).sum()

    where = ProbeInput(forward=forward, device=torch.device(device), model=model, autocast=autocast)
    assert FLOAT8_HEAD.probe is not None
    return FLOAT8_HEAD.probe(where)


def test_the_probe_times_the_head_and_says_why_float8_cannot_run_here() -> None:
    """On a CPU: the head's matmul timed as it is; float8's value is the device's refusal, in
    its words (the second stage leaves such a value out); the model left as it was."""
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 64))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    figures = _head_probe(model, torch.randn(8, 16), "cpu")
    assert set(figures) == {"bf16", "float8"}, figures
    bf16, fp8 = figures["bf16"], figures["float8"]
    assert isinstance(bf16, float) and bf16 > 0
    assert isinstance(fp8, str) and "compute capability" in fp8 and "cpu" in fp8
    assert not model[2]._forward_pre_hooks  # the probe's hook is gone
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert all(type(m) in (nn.Linear, nn.ReLU, nn.Sequential) for m in model.modules())


class _TwoHeads(nn.Module):
    """Two output heads of other widths, called in another order than their names sort, the
    first twice (as a multi-token head shares `lm_head`)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Linear(16, 32)
        self.lm_head = nn.Linear(32, 64)
        self.aux = nn.Linear(16, 48)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.body(x)
        return self.lm_head(hidden).sum() + self.lm_head(hidden).sum() + self.aux(x).sum()


def test_the_probe_times_each_call_on_its_own_head() -> None:
    """Each recorded input on a copy of the head that took it: timed on another head's weight,
    the widths would not match and the value would read as one that cannot run."""
    figures = _head_probe(_TwoHeads(), torch.randn(8, 16), "cpu")
    assert isinstance(figures["bf16"], float) and figures["bf16"] > 0, figures


def test_a_head_float8_cannot_take_has_nothing_to_probe() -> None:
    """The transformer's head is 256 -> 1000: no value of the lever changes anything there."""
    model = load_workload("transformer", "small", seed=0).model
    assert _head_probe(model, torch.zeros(2, 8, dtype=torch.long), "cpu") == {}


def _capable() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability() >= MIN_CAPABILITY


@pytest.mark.gpu
@pytest.mark.models
@pytest.mark.skipif(not _capable(), reason="needs a CUDA GPU of compute capability >= 8.9")
@pytest.mark.parametrize("compile_scope", ["model", "blocks"])
def test_on_a_float8_gpu_the_head_runs_in_float8_and_comes_back(compile_scope: str) -> None:
    pytest.importorskip("torchao.float8")
    pytest.importorskip("transformers")
    args = {"arch": "llama", "hidden": "512", "layers": "2", "heads": "8", "kv_heads": "2"}
    args |= {"vocab": "8192", "seq": "256", "batch": "8", "batches": "4"}
    workload = load_workload("hf:causal-lm", "small", seed=0, model_args=args)
    kinds: list[str] = []
    loss_fn = workload.loss_fn

    def observed(model: Any, batch: Any) -> Any:
        kinds.append(type(workload.model.lm_head).__name__)
        return loss_fn(model, batch)

    workload.loss_fn = observed
    config = LoopConfig.from_dict({"compile": "default", "compile_scope": compile_scope, **HEAD})
    steps = RunArgs(steps=6, warmup=2, windows=1, device="cuda", precision="float8")
    result = run(workload, config, steps)
    # The run's steps (the last calls; the FLOP count's forward comes before the conversion).
    assert kinds[-6:] == ["Float8Linear"] * 6
    assert all(math.isfinite(x) for x in result.losses) and result.losses[-1] < result.losses[0]
    assert type(workload.model.lm_head) is nn.Linear  # given back
    assert not any(is_float8(m) for m in workload.model.modules())


@pytest.mark.gpu
@pytest.mark.skipif(not _capable(), reason="needs a CUDA GPU of compute capability >= 8.9")
def test_on_a_float8_gpu_the_probe_times_both_values_and_leaves_the_model() -> None:
    pytest.importorskip("torchao.float8")
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 8192)).cuda()
    before = {k: v.clone() for k, v in model.state_dict().items()}

    def bf16() -> Any:  # a float8 run's autocast (`trainers.precision`): bf16 on CUDA
        return torch.autocast("cuda", dtype=torch.bfloat16)

    figures = _head_probe(model, torch.randn(4096, 256, device="cuda"), "cuda", bf16)
    assert all(isinstance(figures[v], float) and figures[v] > 0 for v in ("bf16", "float8"))
    assert not any(is_float8(m) for m in model.modules())
    assert all(p.grad is None for p in model.parameters())
    assert not model[2]._forward_pre_hooks
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.gpu
@pytest.mark.skipif(not _capable(), reason="needs a CUDA GPU of compute capability >= 8.9")
def test_on_a_float8_gpu_a_head_float8_cannot_take_is_refused_in_one_line() -> None:
    pytest.importorskip("torchao.float8")
    workload = load_workload("transformer", "small", seed=0)  # head 256 -> 1000: not 16s
    steps = RunArgs(steps=2, warmup=1, windows=1, device="cuda", precision="float8")
    with pytest.raises(ConfigError) as caught:
        run(workload, LoopConfig.from_dict(HEAD), steps)
    assert "256 x 1000" in str(caught.value) and "\n" not in str(caught.value)
    assert not any(is_float8(m) for m in workload.model.modules())  # the conversion undone
