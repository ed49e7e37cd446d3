"""No type is coerced into another in a job's `fix` and `space`: for every setting, a value of the
wrong JSON type (`true` for an integer, `1` for a boolean, `1.0` for an integer, a number for a
name, text for a number) is a 422 naming the field, and nothing is queued. And a body nested
deeper than JSON's parser goes is a 422 that says so."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

import trainers
from api.schemas.jobs import FixIn
from tests.api.helpers import AUTH, TINY_JOB


def _valid(name: str) -> Any:
    """A value LoopConfig allows for `name`, of its own type (the lever table's kind)."""
    kind = trainers.LEVERS[name].kind
    if kind == "str":
        return trainers.LEVERS[name].values()[0]
    if kind == "bool":
        return True
    if kind == "float":
        return 0.5
    for value in range(1, 40):
        try:
            trainers.check_setting(name, value)
        except trainers.ConfigError:
            continue
        return value
    raise AssertionError(f"no integer allowed for {name}")


def _wrong_types(value: Any) -> list[Any]:
    """JSON values of another type that a lenient parser would take for `value`."""
    if isinstance(value, bool):
        return [1, 0, "true", 1.0]
    if isinstance(value, int):
        return [True, float(value), str(value)]
    if isinstance(value, float):
        return [True, str(value)]
    return [1, True, [value, [value]]]


CASES = [(name, wrong) for name in FixIn.model_fields for wrong in _wrong_types(_valid(name))]


def _named(errors: list[dict[str, Any]], where: str, name: str) -> bool:
    return any(e["loc"][:2] == ["body", where] and name in e["loc"] for e in errors)


def test_every_setting_has_cases() -> None:
    assert {name for name, _ in CASES} == set(FixIn.model_fields)
    assert ("micro_batches", True) in CASES and ("micro_batches", 1.0) in CASES


@pytest.mark.parametrize(("name", "wrong"), CASES)
def test_a_wrong_type_in_fix_or_space_is_a_422_naming_the_field(
    client: TestClient, name: str, wrong: Any
) -> None:
    queued = client.get("/v1/jobs", headers=AUTH).json()["total"]
    searched = {"num_streams": [1, 2]} if name != "num_streams" else {"sync_interval": [1, 2]}
    bodies = {
        "fix": TINY_JOB | {"fix": {name: wrong}},
        "space": TINY_JOB | {"space": searched | {name: wrong}},
        "space list": TINY_JOB | {"space": searched | {name: [wrong]}},
    }
    for label, body in bodies.items():
        answer = client.post("/v1/jobs", json=body, headers=AUTH)
        assert answer.status_code == 422, (label, answer.text)
        assert _named(answer.json()["detail"], label.split()[0], name), (label, answer.text)
    assert client.get("/v1/jobs", headers=AUTH).json()["total"] == queued  # nothing stored


def test_micro_batches_true_is_not_stored_as_one(client: TestClient) -> None:
    answer = client.post("/v1/jobs", json=TINY_JOB | {"fix": {"micro_batches": True}}, headers=AUTH)
    assert answer.status_code == 422
    (error,) = answer.json()["detail"]
    assert error["loc"] == ["body", "fix", "micro_batches"]
    stored = client.post("/v1/jobs", json=TINY_JOB | {"fix": {"micro_batches": 2}}, headers=AUTH)
    assert stored.status_code == 201 and stored.json()["fix"]["micro_batches"] == 2


def test_a_null_setting_in_fix_or_space_is_a_422_not_dropped(client: TestClient) -> None:
    """`"fix": {"sync_mode": null}` had been stored as no pin, with 201: the explicit null was
    dropped with the unset settings (a probe, 2026-12-07)."""
    queued = client.get("/v1/jobs", headers=AUTH).json()["total"]
    for where, body in (
        ("fix", {"fix": {"sync_mode": None}}),
        ("space", {"space": {"num_streams": [1, 2], "sync_mode": None}}),
    ):
        answer = client.post("/v1/jobs", json=TINY_JOB | body, headers=AUTH)
        assert answer.status_code == 422, answer.text
        (error,) = answer.json()["detail"]
        assert error["loc"][:3] == ["body", where, "sync_mode"]
        assert "leave the setting out for its default" in error["msg"]
    assert client.get("/v1/jobs", headers=AUTH).json()["total"] == queued  # nothing stored
    left_out = client.post("/v1/jobs", json=TINY_JOB | {"fix": {"pin_memory": True}}, headers=AUTH)
    assert left_out.status_code == 201 and left_out.json()["fix"] == {"pin_memory": True}


@pytest.mark.parametrize("field", ["trials", "model_args", "objectives", "device", "screen"])
def test_a_null_for_a_defaulted_field_says_to_leave_it_out(client: TestClient, field: str) -> None:
    """`"trials": null` had met pydantic's "Input should be a valid integer" (a probe,
    2026-12-07); a field whose default is null (`precision`) still takes null."""
    answer = client.post("/v1/jobs", json=TINY_JOB | {field: None}, headers=AUTH)
    assert answer.status_code == 422, answer.text
    (error,) = answer.json()["detail"]
    assert error["loc"] == ["body", field]
    assert error["msg"].endswith("null is not a value of this field: leave it out for its default")
    # The validator's error in `ctx` as its sentence, not Python's repr of it ("ValueError('..")
    assert error["ctx"] == {"error": error["msg"].removeprefix("Value error, ")}
    taken = client.post("/v1/jobs", json=TINY_JOB | {"precision": None}, headers=AUTH)
    assert taken.status_code == 201, taken.text


@pytest.mark.parametrize("opener", ["[", '{"a":'])
def test_a_body_nested_5000_deep_is_a_422_that_says_so(client: TestClient, opener: str) -> None:
    closer = "]" if opener == "[" else "}"
    body = opener * 5000 + "1" + closer * 5000
    answer = client.post(
        "/v1/jobs", content=body, headers=AUTH | {"content-type": "application/json"}
    )
    assert answer.status_code == 422
    (error,) = answer.json()["detail"]
    # The body is valid UTF-8 and valid JSON syntax: neither is what the message blames.
    assert "nested too deeply" in error["msg"] and "UTF-8" not in error["msg"]


@pytest.mark.parametrize("digits", [4300, 4301, 10_000])
def test_an_integer_too_long_to_read_is_a_422_that_says_so(client: TestClient, digits: int) -> None:
    """Past 4,300 digits Python's parser refuses an integer: it was "send JSON in UTF-8" (a new
    API client's trial); up to there the field's own bound names it."""
    body = '{"workload": "mlp", "preset": "tiny", "trials": ' + "9" * digits + "}"
    answer = client.post(
        "/v1/jobs", content=body, headers=AUTH | {"content-type": "application/json"}
    )
    assert answer.status_code == 422
    (error,) = answer.json()["detail"]
    assert "UTF-8" not in error["msg"], error
    if digits > 4300:
        assert "an integer of more than 4,300 digits" in error["msg"], error
    else:
        assert error["loc"] == ["body", "trials"], error


def test_a_body_that_is_not_utf8_is_a_422_that_says_so(client: TestClient) -> None:
    answer = client.post(
        "/v1/jobs",
        content=b'{"workload": "\xff"}',
        headers=AUTH | {"content-type": "application/json"},
    )
    assert answer.status_code == 422
    assert "not valid UTF-8" in answer.json()["detail"][0]["msg"]
