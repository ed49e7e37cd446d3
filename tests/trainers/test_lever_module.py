"""A new lever is one module: declared here alone (two values, a context around the forward, a
refusal on a CPU), it is validated by `LoopConfig`, accepted and refused alike by the API's job
schema and the CLI's `--fix`, offered by the search space, applied by a run, and a stored config
from before it keeps its key. Nothing outside this file names it.

Each test registers the lever for its own duration (`trainers.levers.registered`), so the rest of
the suite sees the table as `trainers` declares it.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

import pytest
import torch
from pydantic import ValidationError
from torch.nn.attention import SDPBackend, sdpa_kernel

from api.schemas.jobs import job_model
from trainers import LEVERS, ConfigError, LoopConfig, RunArgs, invalid_reason, load_workload, run
from trainers.levers import Lever, Value, ranked, register, registered
from tuner.errors import SpaceError
from tuner.search.spaces.named import load_space
from tuner.search.spaces.pins import parse_fix
from tuner.search.spaces.space import SearchSpace, config_key

NAME = "kernel_probe"
ENTERED: list[Value] = []
"""The value each entry of the lever's context was made for, in order (the run's observation)."""
INSIDE: list[bool] = []
"""Per forward of the model: whether the lever's context was open around it."""
_OPEN: list[Value] = []

STORED = {"num_streams": 2, "sync_mode": "event", "compile": "default"}
STORED_KEY = config_key(LoopConfig.from_dict(STORED))
"""The key of a stored config, taken when this module is imported: before the lever exists."""


def _refuse_on(value: Value, device: str) -> str | None:
    if value == "cudnn" and device != "cuda":
        return f"{NAME}='cudnn' needs a CUDA device, and this run is on {device}"
    return None


@contextlib.contextmanager
def _around_forward(value: Value) -> Iterator[None]:
    ENTERED.append(value)
    _OPEN.append(value)
    try:
        if value == "cudnn":
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                yield
        else:
            yield
    finally:
        _OPEN.pop()


PROBE = Lever(
    name=NAME,
    label="the scaled-dot-product-attention backend around the forward (a test's own lever)",
    kind="str",
    default="default",
    added=99,
    options=ranked(("default", "none", "exact", 0), ("cudnn", "none", "equivalence", 0)),
    refuse_on=_refuse_on,
    around_forward=_around_forward,
    offered=("default", "cudnn"),
)


@pytest.fixture
def probe() -> Iterator[Lever]:
    ENTERED.clear()
    INSIDE.clear()
    with registered(PROBE) as lever:
        yield lever
    assert NAME not in LEVERS


def test_loop_config_validates_it(probe: Lever) -> None:
    config = LoopConfig.from_dict({NAME: "cudnn", "num_streams": 2})
    assert config.get(NAME) == "cudnn"
    assert config.to_dict()[NAME] == "cudnn"
    assert LoopConfig().get(NAME) == "default"
    assert LoopConfig().replace(**{NAME: "cudnn"}) == config.replace(num_streams=1)
    with pytest.raises(ConfigError, match=f"{NAME}.*one of default, cudnn"):
        LoopConfig.from_dict({NAME: "flash"})
    # The refusal on a device: the one predicate a space and run() share.
    assert invalid_reason({NAME: "cudnn"}, device_type="cuda") is None
    assert "needs a CUDA device" in str(invalid_reason({NAME: "cudnn"}, device_type="cpu"))
    assert invalid_reason({NAME: "default"}, device_type="cpu") is None


def _api_accepts(values: dict[str, object]) -> bool:
    model = job_model()
    try:
        model.model_validate({"workload": "mlp", "preset": "tiny", "fix": values})
    except ValidationError:
        return False
    return True


def _cli_accepts(values: dict[str, object]) -> bool:
    try:
        parse_fix([f"{name}={value}" for name, value in values.items()])
    except SpaceError:
        return False
    return True


@pytest.mark.parametrize("value", ["default", "cudnn", "flash", "", "CUDNN"])
def test_the_api_and_the_cli_accept_and_refuse_its_values_alike(probe: Lever, value: str) -> None:
    declared = value in probe.values()
    assert _api_accepts({NAME: value}) is declared
    assert _cli_accepts({NAME: value}) is declared
    if declared:
        job = job_model().model_validate(
            {"workload": "mlp", "preset": "tiny", "space": {NAME: ["default", value]}}
        )
        assert job.to_spec().space == {NAME: ["default", value]}


def test_the_search_space_offers_it_and_leaves_out_what_a_cpu_refuses(probe: Lever) -> None:
    gpu = load_space("full")
    assert gpu.params[NAME].values == ("default", "cudnn")  # type: ignore[union-attr]
    configs = {gpu.config_from_params({**_firsts(gpu), NAME: v}).get(NAME) for v in probe.values()}
    assert configs == {"default", "cudnn"}
    # On a CPU the built-in space leaves it out without a trace (its default alone: a CPU study
    # stored before it was offered resumes); a space of one's own that asks for it is told.
    cpu = load_space("full", cuda=False)
    assert NAME not in cpu.params and NAME not in cpu.fixed
    assert not any(NAME in note for note in cpu.notes)
    own = load_space({NAME: ["default", "cudnn"], "num_streams": [1, 2]}, cuda=False)
    assert own.fixed[NAME] == "default" and any(NAME in note for note in own.notes)
    with pytest.raises(SpaceError, match=NAME):
        load_space("full", fix=(f"{NAME}=cudnn",), cuda=False)
    again = SearchSpace.from_dict(json.loads(json.dumps(gpu.to_dict())))
    assert again == gpu


def _firsts(space: SearchSpace) -> dict[str, object]:
    out: dict[str, object] = {}
    for field, spec in space.params.items():
        out[field] = spec.values[0] if hasattr(spec, "values") else spec.low  # type: ignore[union-attr]
    return out


def test_a_run_applies_its_context_around_every_forward(probe: Lever) -> None:
    workload = load_workload("mlp", "tiny", seed=0)

    def seen(module: torch.nn.Module, inputs: object) -> None:
        INSIDE.append(bool(_OPEN))

    hook = workload.model.register_forward_pre_hook(seen)
    try:
        args = RunArgs(steps=4, warmup=1, windows=2, device="cpu")
        result = run(workload, LoopConfig(), args)
    finally:
        hook.remove()
    assert len(result.losses) == 5
    # Every forward of the run's 5 steps ran inside the lever's context, made for its value;
    # the one forward outside it is the FLOP count's, on the plain model before the first step.
    assert INSIDE[-5:] == [True] * 5 and INSIDE.count(True) == 5
    assert ENTERED == ["default"] * 5
    with pytest.raises(Exception, match="needs a CUDA device"):
        run(workload, LoopConfig.from_dict({NAME: "cudnn"}), args)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_forward_runs_under_the_cudnn_backend(probe: Lever) -> None:
    workload = load_workload("mlp", "tiny", seed=0)
    flash: list[bool] = []

    def seen(module: torch.nn.Module, inputs: object) -> None:
        flash.append(torch.backends.cuda.flash_sdp_enabled())

    hook = workload.model.register_forward_pre_hook(seen)
    try:
        # One window: the default's 5 do not fit in 2 steps (the first GPU run, 2026-11-28).
        config = LoopConfig.from_dict({NAME: "cudnn"})
        run(workload, config, RunArgs(steps=2, warmup=1, windows=1))
    finally:
        hook.remove()
    # sdpa_kernel(CUDNN_ATTENTION) turns the other backends off while it is open.
    assert flash[-3:] == [False] * 3
    assert ENTERED == ["cudnn"] * 3


def test_a_config_stored_before_it_keeps_its_key(probe: Lever) -> None:
    # The pinned key of the default config, as test_space pins it, is unchanged.
    assert config_key(LoopConfig()) == "53b15d1b156a"
    # A stored config loads and keeps its key; the lever off its default is another config.
    loaded = LoopConfig.from_dict(STORED)
    assert loaded.get(NAME) == "default" and config_key(loaded) == STORED_KEY
    assert config_key(loaded.replace(**{NAME: "cudnn"})) != config_key(loaded)


def test_a_module_lever_must_say_when_it_was_added() -> None:
    with pytest.raises(ValueError, match="added >= 1"):
        register(Lever(name="x_probe", label="x", kind="bool", default=False, added=0))
    with pytest.raises(TypeError):
        Lever(name="y_probe", label="y", kind="bool", default=False)  # type: ignore[call-arg]
    assert "x_probe" not in LEVERS and "y_probe" not in LEVERS
