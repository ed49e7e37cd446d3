from __future__ import annotations

import itertools
import json

import pytest

from trainers import (
    COMPILE_MODES,
    OPTIMIZERS,
    REFERENCE,
    ConfigError,
    LoopConfig,
    did_you_mean,
    field_names,
    invalid_reason,
)
from trainers.levers import FIELD_LEVERS, LEVERS


def test_defaults_are_the_pytorch_idiom() -> None:
    assert (
        LoopConfig(num_streams=1, sync_interval=1, sync_mode="synchronize", cuda_graph=False)
        == REFERENCE
    )


def test_keyword_only() -> None:
    with pytest.raises(TypeError):
        LoopConfig(2)  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value", "allowed"),
    [
        ("num_streams", 0, "1..4"),
        ("num_streams", 5, "1..4"),
        ("num_streams", True, "1..4"),
        ("num_streams", 2.0, "1..4"),
        ("sync_interval", 0, "in 1..10000"),
        ("sync_mode", "sometimes", "synchronize, event, query"),
        ("prefetch_depth", 5, "0..4"),
        ("prefetch_depth", -1, "0..4"),
        ("pin_memory", 1, "true or false"),
        ("non_blocking", "yes", "true or false"),
        ("num_workers", -2, "0..32"),
        ("cuda_graph", None, "true or false"),
        ("compile", "max-autotune", "none, default, max-autotune-no-cudagraphs, reduce-overhead"),
        ("compile", True, "none, default, max-autotune-no-cudagraphs, reduce-overhead"),
        ("compile", None, "none, default, max-autotune-no-cudagraphs, reduce-overhead"),
        ("optimizer", "adam", "as-built, foreach, fused, compiled"),
        ("optimizer", 1, "as-built, foreach, fused, compiled"),
    ],
)
def test_invalid_value_names_field_value_and_allowed(
    field: str, value: object, allowed: str
) -> None:
    with pytest.raises(ConfigError) as info:
        LoopConfig(**{field: value})
    message = str(info.value)
    assert field in message
    assert repr(value) in message
    assert allowed in message
    assert info.value.field == field


def test_round_trip_through_json() -> None:
    config = LoopConfig(
        num_streams=4,
        sync_interval=17,
        sync_mode="query",
        prefetch_depth=2,
        pin_memory=True,
        non_blocking=True,
        num_workers=2,
        cuda_graph=True,
        compile="max-autotune-no-cudagraphs",
        optimizer="fused",
    )
    again = LoopConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config
    assert tuple(config.to_dict()) == field_names()


def test_from_dict_rejects_unknown_field() -> None:
    with pytest.raises(
        ConfigError, match=r"streams.*LoopConfig field \(did you mean num_streams\?\): num_streams"
    ):
        LoopConfig.from_dict({"streams": 2})


def test_replace_validates() -> None:
    assert LoopConfig().replace(num_streams=3).num_streams == 3
    with pytest.raises(ConfigError, match="sync_interval"):
        LoopConfig().replace(sync_interval=0)


def test_new_levers_default_to_todays_loop() -> None:
    assert REFERENCE.compile == "none"
    assert REFERENCE.optimizer == "as-built"
    assert COMPILE_MODES == ("none", "default", "max-autotune-no-cudagraphs", "reduce-overhead")
    assert OPTIMIZERS == ("as-built", "foreach", "fused", "compiled")


def test_a_stored_config_from_before_the_new_levers_still_loads() -> None:
    # A trial's config as studies stored it before compile/optimizer existed.
    stored = {
        "num_streams": 2,
        "sync_interval": 10,
        "sync_mode": "event",
        "prefetch_depth": 1,
        "pin_memory": True,
        "non_blocking": True,
        "num_workers": 0,
        "cuda_graph": True,
    }
    config = LoopConfig.from_dict(json.loads(json.dumps(stored)))
    assert config.compile == "none" and config.optimizer == "as-built"
    loaded = config.to_dict()
    # A lever module's lever (none among the table's own) is at its declared default.
    modules = {name: lever.default for name, lever in LEVERS.items() if name not in FIELD_LEVERS}
    assert {k: v for k, v in loaded.items() if k not in FIELD_LEVERS} == modules
    # Every LoopConfig field added since is at the default it was added with.
    assert {k: v for k, v in loaded.items() if k in FIELD_LEVERS} == {
        **stored,
        "compile": "none",
        "optimizer": "as-built",
        "micro_batches": 1,
        "activation_checkpointing": "none",
        "checkpoint_share": 1.0,
        "compile_scope": "model",
        "parallel": "none",
        "bucket_cap_mb": 25,
        "gradient_as_bucket_view": False,
        "static_graph": False,
        "reshard_after_forward": True,
        "fsdp_prefetch": False,
    }
    assert invalid_reason(stored) is None


@pytest.mark.parametrize(
    ("settings", "field", "allowed"),
    [
        (
            {"cuda_graph": True, "compile": "reduce-overhead"},
            "compile",
            "none, default or max-autotune-no-cudagraphs with cuda_graph=True",
        ),
        (
            {"cuda_graph": True, "optimizer": "compiled"},
            "optimizer",
            "as-built, foreach or fused with cuda_graph=True",
        ),
    ],
)
def test_invalid_combinations_name_the_field_and_what_is_allowed(
    settings: dict[str, object], field: str, allowed: str
) -> None:
    with pytest.raises(ConfigError) as info:
        LoopConfig(**settings)  # type: ignore[arg-type]
    assert info.value.field == field
    assert allowed in str(info.value)
    # The same rule, as the predicate a search space uses.
    reason = invalid_reason(settings)
    assert reason is not None and allowed in reason
    # replace() goes through the same validation.
    with pytest.raises(ConfigError):
        LoopConfig(cuda_graph=True).replace(**{field: settings[field]})


def test_every_other_combination_of_the_levers_is_valid() -> None:
    refused = {(True, "reduce-overhead"), (True, "compiled")}
    for graph, mode, optimizer in itertools.product([False, True], COMPILE_MODES, OPTIMIZERS):
        settings = {"cuda_graph": graph, "compile": mode, "optimizer": optimizer}
        reason = invalid_reason(settings)
        expected_invalid = (graph, mode) in refused or (graph, optimizer) in refused
        assert (reason is not None) == expected_invalid, (settings, reason)
        if reason is None:
            assert LoopConfig(**settings).to_dict() == {**REFERENCE.to_dict(), **settings}  # type: ignore[arg-type]


def test_invalid_reason_covers_precision_and_device() -> None:
    assert invalid_reason({}) is None
    assert invalid_reason({"num_streams": 9}) == (
        "num_streams=9 is invalid: allowed an integer in 1..4"
    )
    assert invalid_reason({"streams": 2}) is not None  # unknown field
    reason = invalid_reason({"cuda_graph": True}, precision="fp16-autocast")
    assert reason is not None and "precision='fp16-autocast'" in reason
    assert "bf16-autocast" in reason
    assert invalid_reason({"cuda_graph": True}, precision="bf16-autocast") is None
    assert invalid_reason({}, precision="fp16-autocast") is None
    reason = invalid_reason({}, precision="int8")
    assert reason is not None and "fp32, tf32, bf16-autocast, fp16-autocast" in reason
    reason = invalid_reason({"compile": "reduce-overhead"}, device_type="cpu")
    assert reason is not None and "needs a CUDA device" in reason
    assert invalid_reason({"cuda_graph": True}, device_type="cpu") is not None
    assert invalid_reason({"compile": "reduce-overhead"}, device_type="cuda") is None
    assert invalid_reason({"compile": "default"}, device_type="cpu") is None


def test_a_hint_names_each_close_choice_once() -> None:
    # `--model-arg arch=gpt-neox` had said "did you mean gpt_neox, gpt_neox?" (a name in both
    # the named architectures and transformers' model types).
    assert did_you_mean("gpt-neox", ["gpt_neox", "llama", "gpt_neox", "gpt_neo"]) == (
        " (did you mean gpt_neox, gpt_neo?)"
    )
