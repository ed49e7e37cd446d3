"""What a client may send besides plain JSON: a compressed body is decoded (and held to the body
limit once decoded), and a query string is checked whole, not read in part."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import make_app
from tests.api.helpers import AUTH, TINY_JOB, served

LIMIT = 4096
JSON = AUTH | {"Content-Type": "application/json"}


@pytest.fixture
def client(storage: str) -> Iterator[TestClient]:
    with TestClient(make_app(storage, max_body_bytes=LIMIT)) as test_client:
        yield test_client


def _post(client: TestClient, body: bytes, coding: str) -> httpx.Response:
    return client.post("/v1/jobs", content=body, headers=JSON | {"Content-Encoding": coding})


@pytest.mark.parametrize(
    ("coding", "compress"),
    [("gzip", gzip.compress), ("x-gzip", gzip.compress), ("deflate", zlib.compress)],
)
def test_a_compressed_body_is_read_as_the_json_it_holds(
    client: TestClient, coding: str, compress: object
) -> None:
    job = TINY_JOB | {"trials": 2}
    response = _post(client, compress(json.dumps(job).encode()), coding)  # type: ignore[operator]
    assert response.status_code == 201, response.text
    assert response.json()["trials"] == 2
    assert client.get(response.headers["Location"], headers=AUTH).json()["trials"] == 2


def test_codings_applied_in_turn_are_undone_last_first(client: TestClient) -> None:
    body = gzip.compress(zlib.compress(json.dumps(TINY_JOB).encode()))
    assert _post(client, body, "deflate, gzip").status_code == 201
    assert _post(client, json.dumps(TINY_JOB).encode(), "identity").status_code == 201


def test_a_body_that_inflates_past_the_limit_is_a_413_however_small_it_came(
    client: TestClient,
) -> None:
    padded = json.dumps(TINY_JOB | {"model_args": {"pad": " " * (10 * LIMIT)}}).encode()
    body = gzip.compress(padded)
    assert len(body) < LIMIT  # it came in under the limit
    response = _post(client, body, "gzip")
    assert response.status_code == 413
    assert "once decoded" in response.json()["detail"]
    assert client.get("/v1/jobs", headers=AUTH).json()["items"] == []  # nothing queued


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'{"workload": "mlp"}', "not valid gzip"),  # sent plain, labelled gzip
        (gzip.compress(json.dumps(TINY_JOB).encode(), mtime=0)[:-12], "ends early"),
        (gzip.compress(json.dumps(TINY_JOB).encode(), mtime=0) + b"junk", "after its end"),
    ],
    # Named ids: a gzip header carries its time of writing, and bytes in an id made each
    # pytest-xdist worker collect a differently named test (a CI run failed so).
    ids=["plain-labelled-gzip", "truncated", "trailing-junk"],
)
def test_a_body_that_is_not_what_its_coding_says_is_a_400(
    client: TestClient, body: bytes, why: str
) -> None:
    response = _post(client, body, "gzip")
    assert response.status_code == 400
    assert why in response.json()["detail"]


def test_an_empty_body_under_a_coding_is_left_empty(client: TestClient) -> None:
    """A client that compresses every request labels a bodiless POST too (a cancel)."""
    job = client.post("/v1/jobs", json=TINY_JOB, headers=AUTH).json()
    cancel = f"/v1/jobs/{job['id']}/cancel"
    response = client.post(cancel, headers=AUTH | {"Content-Encoding": "gzip"})
    assert response.status_code < 400, response.text
    response = client.post(cancel, headers=AUTH | {"Content-Encoding": "br"})
    assert response.status_code == 409, response.text  # the route's answer: already cancelled


def test_a_coding_not_read_is_a_415_naming_those_that_are(client: TestClient) -> None:
    response = _post(client, json.dumps(TINY_JOB).encode(), "br")
    assert response.status_code == 415
    detail = response.json()["detail"]
    assert "'br'" in detail and "gzip" in detail and "deflate" in detail
    assert client.get("/v1/jobs", headers=AUTH).json()["items"] == []


def test_a_gzip_body_over_a_real_socket(storage: str) -> None:
    with served(make_app(storage, access_log=False)) as port:
        response = httpx.post(
            f"http://127.0.0.1:{port}/v1/jobs",
            content=gzip.compress(json.dumps(TINY_JOB).encode()),
            headers=JSON | {"Content-Encoding": "gzip"},
        )
    assert response.status_code == 201, response.text


def test_an_unknown_query_parameter_is_a_422_naming_it_and_those_taken(
    client: TestClient,
) -> None:
    client.post("/v1/jobs", json=TINY_JOB, headers=AUTH)
    response = client.get("/v1/jobs?limt=1", headers=AUTH)
    assert response.status_code == 422
    (error,) = response.json()["detail"]
    assert error["loc"] == ["query", "limt"]
    assert "limit" in error["msg"] and "offset" in error["msg"]
    job = client.get("/v1/jobs", headers=AUTH).json()["items"][0]
    response = client.get(f"/v1/jobs/{job['id']}?verbose=1", headers=AUTH)
    assert response.status_code == 422
    assert "no query parameters" in response.json()["detail"][0]["msg"]
    assert client.get("/healthz?probe=1").status_code == 422


def test_a_single_valued_parameter_given_twice_is_a_422_but_a_list_may_repeat(
    client: TestClient,
) -> None:
    response = client.get("/v1/jobs?limit=1&limit=200", headers=AUTH)
    assert response.status_code == 422
    (error,) = response.json()["detail"]
    assert error["loc"] == ["query", "limit"] and error["input"] == ["1", "200"]
    query = "workload=hf:causal-lm&preset=tiny&gpu=cpu&model_arg=layers%3D1&model_arg=heads%3D2"
    response = client.get(f"/v1/recommendations?{query}", headers=AUTH)
    assert response.status_code == 404, response.text  # asked as meant: no job has one yet
    assert "layers=1 heads=2" in response.json()["detail"]


def test_a_lookup_names_the_query_parameter_a_workload_refuses(client: TestClient) -> None:
    query = "workload=mlp&preset=tiny&gpu=cpu&model_arg=a%3D1"
    response = client.get(f"/v1/recommendations?{query}", headers=AUTH)
    assert response.status_code == 422
    (error,) = response.json()["detail"]
    assert error["loc"] == ["query", "model_arg"]
    assert error["input"] == "a=1"  # the value refused, as every other 422 (it had been null)
    twice = client.get(f"/v1/recommendations?{query}&model_arg=b%3D2", headers=AUTH).json()
    assert twice["detail"][0]["input"] == ["a=1", "b=2"]


def test_the_token_is_checked_before_the_query(client: TestClient) -> None:
    assert client.get("/v1/jobs?limt=1").status_code == 401


def test_a_key_repeated_in_the_body_is_a_422_naming_it_and_queues_nothing(
    client: TestClient,
) -> None:
    """`{"trials": 1, "trials": 5}` had queued a job of 5 trials (a client's probe)."""
    body = b'{"workload": "mlp", "preset": "tiny", "device": "cpu", "trials": 1, "trials": 5}'
    response = client.post("/v1/jobs", content=body, headers=JSON)
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body", "trials"] and error["msg"] == "given 2 times; give it once"
    nested = b'{"workload": "mlp", "preset": "tiny", "fix": {"pin_memory": true, "pin_memory": 0}}'
    response = client.post(
        "/v1/jobs", content=gzip.compress(nested), headers=JSON | {"Content-Encoding": "gzip"}
    )
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body", "fix", "pin_memory"]
    # In an object a repeated outer key dropped, and inside lists: named by the whole path.
    deep = b'{"fix": {"space": [1, {"k": 1, "k": 2}]}, "fix": {}, "preset": "tiny"}'
    detail = client.post("/v1/jobs", content=deep, headers=JSON).json()["detail"]
    assert [e["loc"] for e in detail] == [["body", "fix", "space", 1, "k"], ["body", "fix"]]
    assert client.get("/v1/jobs", headers=AUTH).json()["items"] == []
    # The same keys once each: queued.
    once = body.replace(b', "trials": 5', b"")
    assert client.post("/v1/jobs", content=once, headers=JSON).status_code == 201
    # A body that does not parse keeps FastAPI's own answer.
    response = client.post("/v1/jobs", content=b'{"trials": 1, "trials"', headers=JSON)
    assert response.status_code == 422 and response.json()["detail"][0]["type"] == "json_invalid"
