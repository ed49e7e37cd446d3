"""The `attention` lever (`trainers/levers/attention.py`), declared in its module alone: what
LoopConfig, the API, `--fix`, the spaces and a run make of it on this machine's CPU, and on a
GPU that the forward runs under the backend it forces."""

from __future__ import annotations

import pytest
import torch

from tests.lever_entry import accepted
from trainers import (
    LEVERS,
    ConfigError,
    LoopConfig,
    RunArgs,
    invalid_reason,
    load_workload,
    probe_levers,
    run,
)
from trainers.flops import first_batch
from trainers.levers.attention import attention_calls, time_backends
from tuner.errors import SpaceError
from tuner.search.spaces.named import load_space
from tuner.search.spaces.space import config_key


def test_it_is_declared_once_and_validated_by_loop_config() -> None:
    lever = LEVERS["attention"]
    assert lever.values() == ("default", "cudnn", "flash") and lever.default == "default"
    assert LoopConfig().get("attention") == "default"
    assert LoopConfig.from_dict({"attention": "flash"}).to_dict()["attention"] == "flash"
    with pytest.raises(ConfigError, match="attention='math' is invalid: allowed one of default"):
        LoopConfig.from_dict({"attention": "math"})
    # A stored config keeps its key: the lever at its default is left out of it.
    assert config_key(LoopConfig()) == "53b15d1b156a"
    assert config_key(LoopConfig().replace(attention="cudnn")) != "53b15d1b156a"


@pytest.mark.parametrize("value", ["cudnn", "flash"])
def test_a_forced_kernel_is_refused_on_a_cpu_in_one_line(value: str) -> None:
    assert invalid_reason({"attention": value}, device_type="cuda") is None
    reason = str(invalid_reason({"attention": value}, device_type="cpu"))
    assert reason == f"attention={value!r} is a CUDA kernel, and this run is on cpu"
    with pytest.raises(SpaceError, match="attention"):
        load_space("full", fix=(f"attention={value}",), cuda=False)
    workload = load_workload("mlp", "tiny", seed=0)
    with pytest.raises(Exception, match="is a CUDA kernel"):
        run(
            workload,
            LoopConfig.from_dict({"attention": value}),
            RunArgs(steps=2, windows=1, device="cpu"),
        )


def test_the_api_and_the_cli_take_the_same_values() -> None:
    for value, allowed in (("cudnn", True), ("flash", True), ("math", False), ("CUDNN", False)):
        api, cli = accepted("attention", value)
        assert api is cli is allowed, value


def test_no_space_searches_it_yet_and_a_fix_pins_it_on_a_gpu() -> None:
    for name in ("full", "scale"):
        space = load_space(name)
        assert "attention" not in space.params, name
    pinned = load_space("full", fix=("attention=cudnn",))
    assert pinned.fixed["attention"] == "cudnn"
    assert all(c.get("attention") == "cudnn" for c in (pinned.config_from_params(_firsts(pinned)),))


def _firsts(space: object) -> dict[str, object]:
    out: dict[str, object] = {}
    for field, spec in space.params.items():  # type: ignore[attr-defined]
        out[field] = spec.values[0] if hasattr(spec, "values") else spec.low
    return out


def test_the_calls_of_one_forward_are_recorded_by_shape_and_timed_per_value() -> None:
    workload = load_workload("transformer", "tiny", seed=0)
    batch = first_batch(workload)
    attentions = [m for m in workload.model.modules() if isinstance(m, torch.nn.MultiheadAttention)]
    ran: list[int] = []
    hooks = [m.register_forward_hook(lambda *_: ran.append(1)) for m in attentions]
    try:
        calls = attention_calls(lambda: workload.loss_fn(workload.model, batch))
    finally:
        for hook in hooks:
            hook.remove()
    # One recorded call per attention module's forward, grouped by kind, and the function
    # the model calls is given back.
    assert sum(c.calls for c in calls) == len(ran) > 0
    assert (
        torch.nn.functional.scaled_dot_product_attention
        is torch._C._nn.scaled_dot_product_attention
    )
    first = calls[0]
    assert first.dtype == "float32" and len(first.query) == 4 and first.key[:2] == first.query[:2]
    timed = time_backends(first, torch.device("cpu"), warmup=1, iters=2)
    assert isinstance(timed["default"], float) and timed["default"] > 0
    assert timed["cudnn"] == "attention='cudnn' is a CUDA kernel, and this run is on cpu"
    assert list(time_backends(first, torch.device("cpu"), iters=1, values=("default",))) == [
        "default"
    ]
    # A model without SDPA: nothing to record, nothing for the lever to change.
    mlp = load_workload("mlp", "tiny", seed=0)
    assert attention_calls(lambda: mlp.loss_fn(mlp.model, first_batch(mlp))) == []


def test_a_call_is_recorded_in_the_dtype_its_kernel_runs_in_under_autocast() -> None:
    """float32 inputs under bf16 autocast run a bf16 kernel: the call is replayed in bf16 (the
    inputs' float32 finds only the math kernel on a GPU)."""
    q = torch.randn(2, 4, 16, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        calls = attention_calls(
            lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        )
    assert [(c.dtype, c.query, c.is_causal, c.calls) for c in calls] == [
        ("bfloat16", (2, 4, 16, 8), True, 1)
    ]
    plain = attention_calls(lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q))
    assert [c.dtype for c in plain] == ["float32"]


def test_the_probe_times_each_value_per_step_at_the_models_shapes_and_changes_nothing() -> None:
    """`Lever.probe` through `trainers.probe_levers`: the model's own SDPA calls, each value's
    milliseconds a step (the CUDA kernels refused on a CPU), no gradient touched, the model
    where it was; a model without SDPA: nothing for the lever to change; a lever without a
    probe: left out."""
    workload = load_workload("transformer", "tiny", seed=0)
    before = {k: v.clone() for k, v in workload.model.state_dict().items()}
    probed = probe_levers(
        workload, ["attention", "kernels"], device=torch.device("cpu"), precision="bf16-autocast"
    )
    assert list(probed) == ["attention"]
    figures = probed["attention"]
    assert isinstance(figures["default"], float) and figures["default"] > 0
    assert figures["cudnn"] == "attention='cudnn' is a CUDA kernel, and this run is on cpu"
    assert all(p.grad is None for p in workload.model.parameters())
    after = workload.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    mlp = load_workload("mlp", "tiny", seed=0)
    assert probe_levers(mlp, ["attention"], device=torch.device("cpu"), precision=None) == {
        "attention": {}
    }
    assert probe_levers(mlp, ["kernels"], device=torch.device("cpu"), precision=None) == {}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_probe_times_every_value_and_leaves_the_model_where_it_was() -> None:
    workload = load_workload("transformer", "small", seed=0)
    probed = probe_levers(
        workload, ["attention"], device=torch.device("cuda"), precision="bf16-autocast"
    )
    figures = probed["attention"]
    assert isinstance(figures["default"], float) and figures["default"] > 0, figures
    # cuDNN's or flash's attention may have no kernel for a shape: then the reason is given.
    assert all(isinstance(v, float | str) for v in figures.values()) and len(figures) == 3
    assert next(workload.model.parameters()).device.type == "cpu"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize(
    ("value", "enabled"),
    [
        ("cudnn", torch.backends.cuda.cudnn_sdp_enabled),
        ("flash", torch.backends.cuda.flash_sdp_enabled),
    ],
)
def test_on_a_gpu_each_forward_runs_with_only_the_forced_backend(
    value: str, enabled: object
) -> None:
    workload = load_workload("mlp", "tiny", seed=0)
    seen: list[tuple[bool, bool]] = []

    def hook(module: torch.nn.Module, inputs: object) -> None:
        others = (
            torch.backends.cuda.mem_efficient_sdp_enabled()
            or torch.backends.cuda.math_sdp_enabled()
        )
        seen.append((bool(enabled()), others))  # type: ignore[operator]

    handle = workload.model.register_forward_pre_hook(hook)
    try:
        result = run(
            workload,
            LoopConfig.from_dict({"attention": value}),
            RunArgs(steps=2, warmup=1, windows=1),
        )
    finally:
        handle.remove()
    assert all(torch.isfinite(torch.tensor(result.losses)))
    # The run's 3 forwards (1 warm-up, 2 timed) each saw the forced backend on, the others off.
    assert seen[-3:] == [(True, False)] * 3
