from __future__ import annotations

import json

import pytest

from trainers import REFERENCE, ConfigError, LoopConfig, field_names


def test_defaults_are_the_pytorch_idiom() -> None:
    assert LoopConfig(num_streams=1, sync_interval=1, sync_mode="synchronize",
                                   cuda_graph=False) == REFERENCE


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
        ("sync_interval", 0, ">= 1"),
        ("sync_mode", "sometimes", "synchronize, event, query"),
        ("prefetch_depth", 5, "0..4"),
        ("prefetch_depth", -1, "0..4"),
        ("pin_memory", 1, "true or false"),
        ("non_blocking", "yes", "true or false"),
        ("num_workers", -2, "0..32"),
        ("cuda_graph", None, "true or false"),
    ],
)
def test_invalid_value_names_field_value_and_allowed(field: str, value: object,
                                                     allowed: str) -> None:
    with pytest.raises(ConfigError) as info:
        LoopConfig(**{field: value})
    message = str(info.value)
    assert field in message
    assert repr(value) in message
    assert allowed in message
    assert info.value.field == field


def test_round_trip_through_json() -> None:
    config = LoopConfig(num_streams=4, sync_interval=17, sync_mode="query", prefetch_depth=2,
                        pin_memory=True, non_blocking=True, num_workers=2, cuda_graph=True)
    again = LoopConfig.from_dict(json.loads(json.dumps(config.to_dict())))
    assert again == config
    assert tuple(config.to_dict()) == field_names()


def test_from_dict_rejects_unknown_field() -> None:
    with pytest.raises(ConfigError, match=r"streams.*LoopConfig field: num_streams"):
        LoopConfig.from_dict({"streams": 2})


def test_replace_validates() -> None:
    assert LoopConfig().replace(num_streams=3).num_streams == 3
    with pytest.raises(ConfigError, match="sync_interval"):
        LoopConfig().replace(sync_interval=0)
