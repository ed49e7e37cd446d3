"""The `kernels` lever (`trainers/levers/kernels.py`), declared in its module alone: LoopConfig,
the API and `--fix` take it, a CPU, the loss lever's `compiled` and a float8 head refuse it in one
line, a model liger-kernel cannot patch refuses its effect in one line and is left as it was, and
every change a patch makes (instance attributes and methods, class attributes, the modeling
module's functions) is put back by its undo. On a CUDA GPU with liger-kernel installed, a tiny
Llama runs through liger's kernels, gives its own code back, and passes the gate."""

from __future__ import annotations

import importlib.util
import sys
import types
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
from trainers.compilation import min_warmup_for_compile
from trainers.gate import gate, required_test
from trainers.levers.kernels import KERNELS, _patched
from trainers.workloads import resolve_factory
from tuner.search.spaces.named import load_space
from tuner.search.spaces.space import config_key

LIGER = {"kernels": "liger"}


def test_it_is_declared_once_and_validated_by_loop_config() -> None:
    lever = LEVERS["kernels"]
    assert lever is KERNELS
    assert lever.values() == ("torch", "liger") and lever.default == "torch"
    assert LoopConfig().get("kernels") == "torch"
    assert LoopConfig.from_dict(LIGER).get("kernels") == "liger"
    with pytest.raises(ConfigError, match="kernels='triton' is invalid: allowed one of torch"):
        LoopConfig.from_dict({"kernels": "triton"})
    # A stored config keeps its key: the lever at its default is left out of it.
    assert config_key(LoopConfig()) == "53b15d1b156a"
    assert config_key(LoopConfig.from_dict(LIGER)) != "53b15d1b156a"
    # Other kernels round otherwise: the gate owes them equivalence; Triton compiles them in
    # the first step, which a warm-up step keeps out of the timed windows.
    assert required_test(LoopConfig.from_dict(LIGER)) == "equivalence"
    assert min_warmup_for_compile(LoopConfig.from_dict(LIGER)) == 1


@pytest.mark.parametrize(
    ("beside", "named"),
    [
        ({"loss": "compiled"}, "loss='model'"),
        ({"float8_head": "float8"}, "float8_head='bf16'"),
        ({"cuda_graph": True}, "a CUDA graph cannot capture"),
        ({"compile": "default"}, "compile_scope='blocks' compiles each layer"),
        ({"compile": "default", "compile_scope": "model"}, "cannot trace"),
    ],
)
def test_what_the_fused_loss_replaces_refuses_it_in_one_line(
    beside: dict[str, str], named: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        LoopConfig.from_dict(LIGER | beside)
    message = str(caught.value)
    assert message.startswith("kernels='liger' is invalid: allowed torch beside")
    assert named in message and "\n" not in message
    LoopConfig.from_dict({"kernels": "torch"} | beside)  # the default goes with either


def test_each_layer_compiled_leaves_the_fused_loss_eager_and_is_allowed() -> None:
    config = LoopConfig.from_dict(LIGER | {"compile": "default", "compile_scope": "blocks"})
    assert config.get("kernels") == "liger" and config.compile_scope == "blocks"


def test_the_api_and_the_cli_take_the_same_values() -> None:
    for value, allowed in (("liger", True), ("torch", True), ("triton", False)):
        api, cli = accepted("kernels", value)
        assert api is cli is allowed, value
    for name in ("full", "scale"):
        assert "kernels" not in load_space(name).params, name  # not searched yet


def test_a_cpu_refuses_it_in_one_line_before_anything_runs() -> None:
    workload = load_workload("mlp", "tiny", seed=0)
    before = {k: v.clone() for k, v in workload.model.state_dict().items()}
    with pytest.raises(UnsupportedOnDevice) as caught:
        run(workload, LoopConfig.from_dict(LIGER), RunArgs(steps=2, windows=1, device="cpu"))
    message = str(caught.value)
    assert "kernels='liger'" in message and "cpu" in message and "\n" not in message
    after = workload.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing trained


def test_a_model_that_is_not_a_hugging_face_model_refuses_its_effect() -> None:
    model = load_workload("mlp", "tiny", seed=0).model
    before = {name: dict(vars(m)) for name, m in model.named_modules()}
    assert KERNELS.transform is not None
    with pytest.raises(ConfigError) as caught:
        KERNELS.transform("liger", model)
    assert "not a Hugging Face model" in str(caught.value) and "\n" not in str(caught.value)
    assert {name: dict(vars(m)) for name, m in model.named_modules()} == before
    # What a search reads before it enqueues the lever (`Lever.refuse_for`): the same words.
    assert invalid_reason({"kernels": "liger"}, model=model) == str(caught.value)
    assert invalid_reason({"kernels": "torch"}, model=model) is None
    KERNELS.transform("torch", model)()  # the default changes nothing, and undoes nothing


def _typed(model_type: str) -> nn.Module:
    """The tiny MLP with a Hugging Face model's `config.model_type`, which is what liger-kernel
    reads to pick its patch."""
    model = load_workload("mlp", "tiny", seed=0).model
    model.config = types.SimpleNamespace(model_type=model_type)  # type: ignore[assignment]
    return model


def test_without_liger_kernel_its_effect_is_refused_naming_the_install() -> None:
    if importlib.util.find_spec("liger_kernel") is not None:
        pytest.skip("liger-kernel is installed here (the models extra's venv)")
    assert KERNELS.transform is not None
    with pytest.raises(ConfigError) as caught:
        KERNELS.transform("liger", _typed("llama"))
    assert "pip install 'streamtune[kernels]'" in str(caught.value)
    assert "\n" not in str(caught.value)


@pytest.mark.models
def test_a_model_type_liger_does_not_patch_is_refused_naming_some_it_does() -> None:
    pytest.importorskip("liger_kernel.transformers")
    assert KERNELS.transform is not None
    with pytest.raises(ConfigError) as caught:
        KERNELS.transform("liger", _typed("mlp-of-my-own"))
    message = str(caught.value)
    assert "model type 'mlp-of-my-own'" in message and "llama" in message and "\n" not in message


@pytest.mark.models
def test_liger_patches_a_decoder_and_the_undo_gives_its_own_code_back() -> None:
    """liger-kernel's own patch, on a tiny Llama (patching needs no GPU: only its kernels do):
    its modules and its modeling module take liger's code, and the undo puts back every one."""
    pytest.importorskip("transformers")
    pytest.importorskip("liger_kernel.transformers")
    from transformers.models.llama import modeling_llama

    model = load_workload("hf:causal-lm", "tiny", seed=0, model_args={"arch": "llama"}).model
    ids = torch.randint(
        0, model.config.vocab_size, (2, 8), generator=torch.Generator().manual_seed(0)
    )
    expected = model(input_ids=ids, labels=ids).loss
    rope, norm_class = modeling_llama.apply_rotary_pos_emb, modeling_llama.LlamaRMSNorm
    own = {name: dict(vars(m)) for name, m in model.named_modules()}
    assert KERNELS.transform is not None
    undo = KERNELS.transform("liger", model)
    patched = [name for name, m in model.named_modules() if "forward" in vars(m)]
    assert any(name.endswith(".mlp") for name in patched), patched  # liger's SwiGLU
    assert any(name.endswith("input_layernorm") for name in patched), patched  # its RMSNorm
    assert "forward" in vars(model)  # its fused linear cross-entropy
    # Nothing module-wide while the run lasts: a Llama built now is transformers' own.
    assert modeling_llama.apply_rotary_pos_emb is rope
    assert modeling_llama.LlamaRMSNorm is norm_class
    other = load_workload("hf:causal-lm", "tiny", seed=1, model_args={"arch": "llama"}).model
    assert not [name for name, m in other.named_modules() if "forward" in vars(m)]
    undo()
    assert {name: dict(vars(m)) for name, m in model.named_modules()} == own
    assert torch.equal(model(input_ids=ids, labels=ids).loss, expected)


class _Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(4))
        self.act = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x * self.weight)


def _fused(self: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return x + 1


ACTIVATIONS = {"relu2": nn.ReLU}
"""A module-level dict a patch may write into (liger's Nemotron patch writes into transformers'
ACT2FN), which every model built later reads."""


def test_every_change_a_patch_makes_is_put_back_and_nothing_else() -> None:
    """A patch of the kinds liger-kernel's makes, on a real module: a bound method, attributes
    and a submodule on an instance; a class attribute; a function and a dict's item of the
    module that defines the class."""
    model = nn.Sequential(_Norm(), nn.Linear(4, 4))
    norm = model[0]
    here = sys.modules[__name__]
    original_fused, original_act = here._fused, norm.act  # type: ignore[attr-defined]
    x = torch.ones(2, 4)
    expected = norm(x).clone()

    def patch() -> None:
        norm.forward = types.MethodType(_fused, norm)  # type: ignore[method-assign]
        norm.casting_mode = "llama"
        norm.act = nn.Tanh()  # a submodule replaced: nn.Module keeps it in `_modules`
        _Norm.extra = "class attribute"  # type: ignore[attr-defined]
        here._fused = len  # type: ignore[attr-defined]  # a module-level function replaced
        ACTIVATIONS["relu2"] = nn.Tanh  # type: ignore[assignment]

    undo, changed = _patched(patch, model)
    # The model's own modules keep the patch for the run; what it set beside them (which would
    # reach every model the process builds meanwhile) is put back at once.
    assert changed == 3  # forward, casting_mode, act
    assert torch.equal(norm(x), x + 1) and norm.casting_mode == "llama"
    assert isinstance(norm.act, nn.Tanh)
    assert not hasattr(_Norm, "extra") and ACTIVATIONS["relu2"] is nn.ReLU
    assert here._fused is original_fused  # type: ignore[attr-defined]
    norm.seen_later = True  # a change the run makes after the patch: not the undo's
    undo()
    assert "forward" not in vars(norm) and not hasattr(norm, "casting_mode")
    assert norm.act is original_act
    assert torch.equal(norm(x), expected)
    assert norm.seen_later is True


def test_a_patch_that_fails_partway_leaves_nothing_behind() -> None:
    model = nn.Sequential(_Norm())
    norm = model[0]

    def patch() -> None:
        norm.forward = types.MethodType(_fused, norm)  # type: ignore[method-assign]
        ACTIVATIONS["relu2"] = nn.Tanh  # type: ignore[assignment]
        raise AttributeError("'LlamaForCausalLM' object has no attribute 'model'")

    with pytest.raises(AttributeError, match="no attribute 'model'"):
        _patched(patch, model)
    assert "forward" not in vars(norm) and ACTIVATIONS["relu2"] is nn.ReLU


def _needs_liger_on_a_gpu() -> None:
    pytest.importorskip("transformers")
    pytest.importorskip("liger_kernel")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.mark.gpu
@pytest.mark.models
def test_a_decoder_runs_through_liger_and_gets_its_own_code_back() -> None:
    _needs_liger_on_a_gpu()
    workload = load_workload("hf:causal-lm", "tiny", seed=0, model_args={"arch": "llama"})
    model = workload.model
    mlps = [m for name, m in model.named_modules() if name.endswith(".mlp")]
    assert mlps and all("forward" not in vars(m) for m in mlps)
    seen: list[Any] = []
    loss_fn = workload.loss_fn

    def observed(model: Any, batch: Any) -> Any:
        seen.append({type(vars(m).get("forward")).__name__ for m in mlps})
        return loss_fn(model, batch)

    workload.loss_fn = observed
    args = RunArgs(steps=3, windows=1, device="cuda", precision="bf16-autocast")
    result = run(workload, LoopConfig.from_dict(LIGER), args)
    assert seen[-1] == {"method"}  # each MLP ran liger's SwiGLU forward, bound to it
    assert all("forward" not in vars(m) for m in mlps)  # and its own class's forward is back
    assert all(loss == loss for loss in result.losses)


@pytest.mark.gpu
@pytest.mark.models
def test_liger_runs_beside_each_layer_compiled() -> None:
    # The whole model compiled is refused (Dynamo cannot trace the fused loss, H200 2026-11-29);
    # each layer compiled runs liger's RMSNorm and SwiGLU inside the layers' compiled code and
    # its fused loss eager.
    _needs_liger_on_a_gpu()
    workload = load_workload("hf:causal-lm", "tiny", seed=0, model_args={"arch": "llama"})
    config = LoopConfig.from_dict(LIGER | {"compile": "default", "compile_scope": "blocks"})
    result = run(
        workload, config, RunArgs(steps=3, windows=1, device="cuda", precision="bf16-autocast")
    )
    assert result.losses and all(loss == loss for loss in result.losses)


@pytest.mark.gpu
@pytest.mark.models
def test_the_gate_judges_liger_by_equivalence() -> None:
    _needs_liger_on_a_gpu()
    factory = resolve_factory("hf:causal-lm", {"arch": "llama"})
    args = RunArgs(steps=8, device="cuda", precision="bf16-autocast")
    verdict = gate(factory, LoopConfig.from_dict(LIGER), args, preset="tiny")
    assert verdict.test == "equivalence" and verdict.passed, verdict.reason
