"""The `loss` lever (`trainers/levers/loss.py`), declared in its module alone: LoopConfig, the
API and `--fix` take it, a model without a loss function of its own and a whole-model compile
refuse it in one line, and on a tiny Hugging Face decoder a run computes its loss through the
compiled function (and gives the original back), and the gate judges it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from tests.lever_entry import accepted
from tests.tuner.workloads_for_tests import own_loss_function
from trainers import (
    LEVERS,
    ConfigError,
    LoopConfig,
    RunArgs,
    canonical,
    invalid_reason,
    load_workload,
    probe_levers,
    run,
)
from trainers.compilation import compiles, min_warmup_for_compile
from trainers.flops import first_batch
from trainers.gate import gate, required_test
from trainers.levers.declare import ProbeInput
from trainers.workloads import resolve_factory
from tuner.search.spaces.named import load_space, without_block_levers, without_inert_levers
from tuner.search.spaces.space import Choice, config_key

COMPILED_LOSS = {"loss": "compiled", "compile": "default", "compile_scope": "blocks"}


def test_it_is_declared_once_and_validated_by_loop_config() -> None:
    lever = LEVERS["loss"]
    assert lever.values() == ("model", "compiled") and lever.default == "model"
    assert LoopConfig().get("loss") == "model"
    assert LoopConfig.from_dict(COMPILED_LOSS).get("loss") == "compiled"
    # Alone, without the model's compile: the loss is the one compiled part.
    assert LoopConfig.from_dict({"loss": "compiled"}).get("loss") == "compiled"
    with pytest.raises(ConfigError, match="loss='fused' is invalid: allowed one of model"):
        LoopConfig.from_dict({"loss": "fused"})
    # A stored config keeps its key: the lever at its default is left out of it.
    assert config_key(LoopConfig()) == "53b15d1b156a"
    assert config_key(LoopConfig.from_dict({"loss": "compiled"})) != "53b15d1b156a"
    # It compiles: the run's compile watch is on, and a warm-up step keeps it out of the windows.
    assert compiles(LoopConfig.from_dict({"loss": "compiled"})) and not compiles(LoopConfig())
    assert min_warmup_for_compile(LoopConfig.from_dict({"loss": "compiled"})) == 1


def test_the_whole_model_compiled_refuses_it_in_one_line() -> None:
    with pytest.raises(ConfigError) as caught:
        LoopConfig.from_dict({"loss": "compiled", "compile": "default"})
    message = str(caught.value)
    assert message.startswith("loss='compiled' is invalid: allowed model with the whole model")
    assert "compile_scope='blocks' or compile='none'" in message and "\n" not in message
    # Set by hand, the two together are refused with the same line.
    reason = invalid_reason({"loss": "compiled", "compile": "reduce-overhead"})
    assert reason is not None and reason.startswith("loss='compiled' is invalid")


def test_beside_the_whole_model_compiled_a_search_runs_it_at_its_default() -> None:
    """Inert there (`Lever.inert`): `canonical`, which a search's sampled configs go through,
    puts it back, so a draw of the two together runs once as the whole model compiled."""
    whole = {"loss": "compiled", "compile": "default", "compile_scope": "model"}
    assert canonical(whole)["loss"] == "model"
    assert canonical(whole | {"compile": "reduce-overhead"})["loss"] == "model"
    assert LoopConfig.from_dict(canonical(whole)).get("loss") == "model"
    # Each layer compiled, or nothing compiled but the loss: it does something, and is kept.
    assert canonical(whole | {"compile_scope": "blocks"})["loss"] == "compiled"
    alone = canonical({"loss": "compiled", "compile": "none", "compile_scope": "blocks"})
    assert alone["loss"] == "compiled" and alone["compile_scope"] == "model"
    # Pinned by hand it is left as it is, for the lever's refusal to name.
    assert canonical(whole, pinned={"loss"})["loss"] == "compiled"


def test_a_space_runs_a_pinned_compiled_loss_or_refuses_it_never_drops_it() -> None:
    space = load_space("scale", fix=["loss=compiled"])
    assert space.fixed["loss"] == "compiled" and "loss" not in space.params
    searched = {"compile_scope": "blocks", "activation_checkpointing": "none"}
    searched |= {"checkpoint_share": 1.0, "micro_batches": 1, "float8_head": "bf16"}
    searched |= {"float8_linears": "all", "cuda_graph": False}
    assert space.config_from_params(searched).get("loss") == "compiled"
    with pytest.raises(ConfigError, match="loss='compiled' is invalid"):
        space.config_from_params(searched | {"compile_scope": "model"})


def test_a_space_where_it_can_do_nothing_does_not_search_it() -> None:
    """`compile_scope` fixed to `model` (a model without repeated blocks, or a pin): each draw
    of the compiled loss would run the whole model compiled again."""
    assert "loss" in without_inert_levers(load_space("scale")).params
    for space in (
        load_space("scale", fix=["compile_scope=model"]),
        without_block_levers(load_space("scale")),
    ):
        assert "loss" not in without_inert_levers(space).params
    # With nothing compiled but the loss, it does something: kept.
    own = load_space({"compile": "none", "loss": ["model", "compiled"], "num_streams": [1, 2]})
    assert "loss" in without_inert_levers(own).params


def test_the_api_and_the_cli_take_the_same_values() -> None:
    for value, allowed in (("compiled", True), ("model", True), ("fused", False)):
        api, cli = accepted("loss", value)
        assert api is cli is allowed, value
    # Searched where each layer may be compiled: not in `full`, whose trials compile nothing,
    # nor in `compile`, whose compiled trials compile the whole model, loss included.
    assert "loss" not in load_space("full").params and "loss" not in load_space("compile").params
    assert load_space("scale").params["loss"] == Choice(values=("model", "compiled"))


def test_a_model_without_a_loss_function_refuses_it_and_is_left_as_it_was() -> None:
    workload = load_workload("mlp", "tiny", seed=0)
    before = dict(vars(workload.model))
    with pytest.raises(ConfigError) as caught:
        run(workload, LoopConfig.from_dict({"loss": "compiled"}), RunArgs(steps=2, windows=1))
    assert "computes no loss of its own through a `loss_function`" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert dict(vars(workload.model)).keys() == before.keys()
    # What a search reads before it enqueues the lever (`Lever.refuse_for`): the same words.
    assert invalid_reason({"loss": "compiled"}, model=workload.model) == str(caught.value)
    assert invalid_reason({"loss": "model"}, model=workload.model) is None


def test_the_probe_times_the_models_own_loss_function_eager_and_compiled() -> None:
    """`Lever.probe` through `trainers.probe_levers`: the loss function a forward calls, timed
    forward and backward as called and compiled, on its own arguments; the model's function
    given back; a model without one: nothing for the lever to change."""
    workload = own_loss_function("tiny", seed=0)
    original = workload.model.loss_function
    probed = probe_levers(workload, ["loss"], device=torch.device("cpu"), precision=None)
    figures = probed["loss"]
    assert set(figures) == {"model", "compiled"}, figures
    assert all(isinstance(v, float) and v > 0 for v in figures.values()), figures
    assert workload.model.loss_function is original
    assert all(p.grad is None for p in workload.model.parameters())
    mlp = load_workload("mlp", "tiny", seed=0)
    assert probe_levers(mlp, ["loss"], device=torch.device("cpu"), precision=None) == {"loss": {}}


def test_the_probe_replays_the_loss_under_the_runs_autocast() -> None:
    """The forward calls the loss function inside the run's autocast; the replayed calls are
    timed inside it too (`ProbeInput.autocast`), or a low-precision run's loss would be timed in
    another arithmetic than its steps run."""
    workload = own_loss_function("tiny", seed=0)
    batch = first_batch(workload)
    entered: list[bool] = []

    @contextlib.contextmanager
    def run_autocast() -> Iterator[None]:
        entered.append(True)
        yield

    where = ProbeInput(
        forward=lambda: workload.loss_fn(workload.model, batch),
        device=torch.device("cpu"),
        model=workload.model,
        autocast=run_autocast,
    )
    probe = LEVERS["loss"].probe
    assert probe is not None
    figures = probe(where)
    assert set(figures) == {"model", "compiled"}, figures
    # Every timed call of both values (the timing's warm-up and its groups) entered it.
    assert len(entered) >= 2 * 13, len(entered)


def _tiny_decoder() -> Any:
    pytest.importorskip("transformers")
    return load_workload("hf:causal-lm", "tiny", seed=0, model_args={"arch": "llama"})


@pytest.mark.models
def test_a_run_computes_the_loss_through_the_compiled_function_and_gives_it_back() -> None:
    workload = _tiny_decoder()
    original = workload.model.loss_function
    seen: list[Any] = []
    loss_fn = workload.loss_fn

    def observed(model: Any, batch: Any) -> Any:
        seen.append(model.loss_function)
        return loss_fn(model, batch)

    workload.loss_fn = observed
    keys = set(vars(workload.model))
    result = run(workload, LoopConfig.from_dict({"loss": "compiled"}), RunArgs(steps=3, windows=1))
    # The steps' forwards (the last calls; the FLOP count's comes before the run's changes)
    # went through torch.compile's wrapper of the model's own function; then the original is back.
    stepped = seen[-3:]
    assert len(stepped) == 3 and all(fn is not original for fn in stepped)
    assert all(getattr(fn, "_torchdynamo_orig_callable", None) is original for fn in stepped)
    assert workload.model.loss_function is original
    # Nothing of it left on the model (transformers' setter stores `_loss_function`, and its
    # getter's `hasattr` is a Dynamo guard): a fresh model's whole compiled code runs on it.
    assert set(vars(workload.model)) == keys
    assert result.compile_s > 0 and all(loss == loss for loss in result.losses)


@pytest.mark.models
def test_the_gate_judges_it_by_equivalence_and_passes_it() -> None:
    pytest.importorskip("transformers")
    config = LoopConfig.from_dict({"loss": "compiled"})
    factory = resolve_factory("hf:causal-lm", {"arch": "llama"})
    assert required_test(config) == "equivalence"
    verdict = gate(factory, config, RunArgs(steps=8), preset="tiny")
    assert verdict.test == "equivalence" and verdict.passed, verdict.reason


@pytest.mark.models
def test_the_probe_times_a_decoders_loss_function_with_its_own_arguments() -> None:
    """Hugging Face's loss function takes its arguments by keyword (logits=, labels=,
    vocab_size=): the probe replays them as given."""
    workload = _tiny_decoder()
    original = workload.model.loss_function
    keys = set(vars(workload.model))
    figures = probe_levers(workload, ["loss"], device=torch.device("cpu"), precision=None)["loss"]
    assert all(isinstance(figures[v], float) and figures[v] > 0 for v in ("model", "compiled"))
    assert workload.model.loss_function is original
    assert set(vars(workload.model)) == keys


@pytest.mark.gpu
@pytest.mark.models
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_a_gpu_the_probe_times_a_decoders_loss_eager_and_compiled() -> None:
    workload = _tiny_decoder()
    device = torch.device("cuda")
    figures = probe_levers(workload, ["loss"], device=device, precision="bf16-autocast")["loss"]
    assert all(isinstance(figures[v], float) and figures[v] > 0 for v in ("model", "compiled"))
    assert next(workload.model.parameters()).device.type == "cpu"
