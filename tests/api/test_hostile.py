"""No request gets a 5xx (issue 27): every route driven with hostile values in its body, path and
query (non-finite numbers, NUL and other control characters, lone surrogates, huge integers,
unknown library families, wrong types), with a token and with an admin token (which reaches every
study), on SQLite and PostgreSQL. The schemathesis run (test_schema.py) explores the documented
schema; this drives what it does not generate (JSON's `NaN`, bytes no schema allows).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from api.app import ROUTERS
from api.errors import JSON_HINT
from api.schemas.jobs import FixIn
from tests.api.conftest import make_app
from tests.api.helpers import ADMIN_AUTH, AUTH, TINY_JOB

# Raw JSON values (text, so that NaN and numbers Python cannot hold can be sent as they are).
HOSTILE_JSON = [
    "NaN",
    "Infinity",
    "-Infinity",
    "1e999",
    "-1e999",
    "1" + "0" * 30,
    "-" + "9" * 30,
    "9" * 5000,  # longer than Python parses into an int by default
    '"\\u0000"',
    '"mlp\\u0000"',
    '"\\ud800"',
    '"\\u001b[31m"',
    '"' + "x" * 5000 + '"',
    '"hf:os"',
    '"hf:__init__"',
    '"hf:"',
    '"timm:"',
    '"torchvision:nope"',
    '"nope:model"',
    '"program:nope"',
    '"../../etc/passwd"',
    "[]",
    "{}",
    "[NaN]",
    '{"low": NaN, "high": Infinity}',
    '{"low": 1, "high": ' + "9" * 40 + "}",
    "true",
    "null",
    "-1",
    "0",
]
# Path and query values, already percent-encoded where they need it.
HOSTILE_TEXT = [
    "%00",
    "a%00b",
    "%ff",
    "%ed%a0%80",  # a UTF-8-encoded surrogate
    "NaN",
    "Infinity",
    "-1",
    "9" * 5000,
    quote("hf:os"),
    quote("../../etc/passwd", safe=""),
    "%1b%5b31m",
    "x" * 3000,
]
TOP = sorted(set(TINY_JOB) | {"space", "fix", "timeout_s", "objectives", "model_args"})
TOP += ["max_memory_bytes", "precision", "trials"]
NESTED = [("space", name) for name in FixIn.model_fields] + [
    ("fix", name) for name in FixIn.model_fields
]
NESTED += [("model_args", "batch"), ("objectives", 0)]


def _body(path: tuple[str | int, ...], raw: str) -> str:
    """TINY_JOB with the value at `path` replaced by the raw JSON text `raw`."""
    marker = "@@HOSTILE@@"
    body: Any = json.loads(json.dumps(TINY_JOB | {"space": {"num_streams": [1, 2]}}))
    target = body
    for key in path[:-1]:
        if key not in target or not isinstance(target[key], dict | list):
            target[key] = [] if isinstance(path[path.index(key) + 1], int) else {}
        target = target[key]
    if isinstance(target, list):
        target.append(marker)
    else:
        target[path[-1]] = marker
    return json.dumps(body).replace(f'"{marker}"', raw)


@pytest.fixture
def app(any_storage: str) -> FastAPI:
    return make_app(any_storage, max_queued_per_token=100_000)


@pytest.fixture
def client(app: FastAPI) -> Iterator[TestClient]:
    with TestClient(app, raise_server_exceptions=False) as test_client:
        yield test_client


def _fine(response: Any, what: object) -> None:
    assert response.status_code < 500, (what, response.status_code, response.text[:500])
    if response.request.method == "HEAD":  # HEAD answers the GET's headers and no body
        assert response.content == b"", (what, response.content[:80])
    elif "json" in response.headers.get("content-type", ""):
        json.loads(response.text)


def test_hostile_bodies_get_no_5xx(client: TestClient) -> None:
    headers = AUTH | {"Content-Type": "application/json"}
    sent = 0
    for path in [(name,) for name in TOP] + NESTED:
        for raw in HOSTILE_JSON:
            body = _body(path, raw)
            _fine(client.post("/v1/jobs", content=body, headers=headers), (path, raw[:40]))
            sent += 1
    for raw in HOSTILE_JSON:  # the whole body, and bytes that are no JSON at all
        _fine(client.post("/v1/jobs", content=raw, headers=headers), raw[:40])
    for junk in (b"\xff\xfe", b"\x00" * 10, b'{"workload": "\xed\xa0\x80"}', b"{" * 5000):
        _fine(client.post("/v1/jobs", content=junk, headers=headers), junk[:20])
    assert sent == (len(TOP) + len(NESTED)) * len(HOSTILE_JSON)


def _routes() -> list[APIRoute]:
    return [r for router in ROUTERS for r in router.routes if isinstance(r, APIRoute)]


def test_hostile_paths_and_queries_get_no_5xx(client: TestClient) -> None:
    job = client.post("/v1/jobs", json=TINY_JOB, headers=AUTH).json()
    routes = _routes()
    assert len(routes) >= 13
    for route in routes:
        params = re.findall(r"\{([^}]+)\}", route.path)
        queries = [p.alias for p in route.dependant.query_params]
        for method in sorted(route.methods):
            for value in HOSTILE_TEXT:
                for headers in (AUTH, ADMIN_AUTH):
                    path = route.path
                    for name in params:
                        path = path.replace("{" + name + "}", value)
                    _fine(client.request(method, path, headers=headers), (method, path[:80]))
                    for query in queries:  # each query parameter hostile, the others sane
                        filled = route.path.replace("{job_id}", job["id"])
                        filled = filled.replace("{name}", job["study"])
                        sane = {q: "cpu" for q in queries if q != query}
                        sane |= {q: "1" for q in ("limit", "offset") if q in sane}
                        url = f"{filled}?{query}={value}&" + "&".join(
                            f"{k}={v}" for k, v in sane.items()
                        )
                        _fine(client.request(method, url, headers=headers), (method, url[:80]))


@pytest.mark.parametrize("raw", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_non_finite_number_is_a_422_naming_the_field(client: TestClient, raw: str) -> None:
    for path in [("timeout_s",)]:
        response = client.post(
            "/v1/jobs",
            content=_body(path, raw),
            headers=AUTH | {"Content-Type": "application/json"},
        )
        assert response.status_code == 422, response.text
        errors = response.json()["detail"]
        assert errors[0]["loc"] == ["body", *path] and "finite" in errors[0]["msg"], errors


@pytest.mark.parametrize("name", ["hf:os", "hf:__init__", "hf:nope"])
def test_a_library_lookup_error_is_a_422_naming_the_workload(client: TestClient, name: str) -> None:
    response = client.post("/v1/jobs", json=TINY_JOB | {"workload": name}, headers=AUTH)
    assert response.status_code == 422, response.text
    error = response.json()["detail"][0]
    assert error["loc"] == ["body", "workload"] and "hf:causal-lm" in error["msg"], error


def test_the_422_handler_echoes_what_json_cannot_carry_as_text(client: TestClient) -> None:
    response = client.post(
        "/v1/jobs",
        content='{"workload": "\\ud800", "preset": "tiny", "trials": ' + "9" * 40 + "}",
        headers=AUTH | {"Content-Type": "application/json"},
    )
    assert response.status_code == 422
    by_field = {tuple(e["loc"])[-1]: e for e in response.json()["detail"]}
    assert by_field["workload"]["input"] == "\\ud800"
    assert by_field["trials"]["input"] == f"an integer of {int('9' * 40).bit_length()} bits"


def test_a_body_without_its_content_type_is_told_to_send_one(client: TestClient) -> None:
    response = client.post("/v1/jobs", content=json.dumps(TINY_JOB), headers=AUTH)
    assert response.status_code == 422
    assert "Content-Type: application/json" in response.json()["detail"][0]["msg"]


@pytest.mark.parametrize("kind", [None, "application/json", "application/json; charset=utf-8"])
def test_an_empty_body_is_told_what_to_send_whatever_its_content_type(
    client: TestClient, kind: str | None
) -> None:
    """Sent as JSON, it had got a bare "Field required" at ("body",) (a probe, 2026-12-07)."""
    headers = AUTH if kind is None else AUTH | {"Content-Type": kind}
    response = client.post("/v1/jobs", content=b"", headers=headers)
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body"], error
    # Sent as JSON already, it is not told to send it as JSON (the review, 2026-12-07).
    told = JSON_HINT if kind is None else "the body must be a JSON object"
    assert error["msg"] == f"Field required: {told}", error


def test_a_body_of_many_unknown_keys_gets_a_422_the_size_of_twenty(client: TestClient) -> None:
    # Each unknown key's error names every allowed field: 5,500 of them in a 64 KiB body had
    # answered 2.5 MB.
    keys = {f"k{i}": 1 for i in range(500)}
    response = client.post("/v1/jobs", json=TINY_JOB | keys, headers=AUTH)
    assert response.status_code == 422
    detail = response.json()["detail"]
    assert len(detail) == 21 and all(e["type"] == "extra_forbidden" for e in detail[:20])
    assert detail[-1]["msg"] == "and 480 more errors, not listed: the first 20 above"
    assert len(response.content) < 40_000
    few = client.post("/v1/jobs", json=TINY_JOB | {"k0": 1, "k1": 1}, headers=AUTH)
    assert [e["loc"][-1] for e in few.json()["detail"]] == ["k0", "k1"]  # all, when few


def test_a_caller_without_a_token_gets_401_whatever_its_body_or_query(client: TestClient) -> None:
    # FastAPI parses the body before the token's check: `{bad` had answered 422 to anyone.
    for headers in ({}, {"Authorization": "Bearer not-a-configured-token-at-all"}):
        for body in ("{bad", "[1]", json.dumps(TINY_JOB | {"trials": -1})):
            response = client.post(
                "/v1/jobs", content=body, headers=headers | {"Content-Type": "application/json"}
            )
            assert response.status_code == 401, (body, response.text)
            assert response.headers["www-authenticate"] == "Bearer"
        assert client.get("/v1/jobs?limit=1000000", headers=headers).status_code == 401
    bad = client.post(
        "/v1/jobs", content="{bad", headers=AUTH | {"Content-Type": "application/json"}
    )
    assert bad.status_code == 422  # with the token: what the body got wrong
