"""HEAD wherever GET answers, a 405's Allow naming every method of its path (`api.methods`), and
a 404 that does not echo a long id back whole."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from api.app import create_metrics_app
from tests.api.helpers import AUTH, TINY_JOB
from tuner.service.submissions import Submissions


def test_head_answers_as_get_with_its_headers_and_no_body(client: TestClient) -> None:
    job = client.post("/v1/jobs", json=TINY_JOB, headers=AUTH).json()
    for path in ("/v1/jobs", f"/v1/jobs/{job['id']}", "/v1/studies", "/healthz", "/metrics"):
        got = client.get(path, headers=AUTH)
        head = client.head(path, headers=AUTH)
        assert got.status_code == 200 and head.status_code == 200, path
        assert head.content == b"" and got.content != b"", path
        assert head.headers["content-length"] == got.headers["content-length"], path
        assert head.headers["content-type"] == got.headers["content-type"], path
    # Its refusals are the GET's: no token, an unknown job.
    assert client.head("/v1/jobs").status_code == 401
    assert client.head("/v1/jobs/" + "0" * 32, headers=AUTH).status_code == 404


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [
        ("DELETE", "/v1/jobs", "GET, HEAD, POST"),  # Starlette's had said POST only
        ("PUT", "/v1/jobs/" + "0" * 32, "GET, HEAD"),
        ("GET", "/v1/jobs/" + "0" * 32 + "/cancel", "POST"),
        ("HEAD", "/v1/jobs/" + "0" * 32 + "/cancel", "POST"),
    ],
)
def test_a_405_names_every_method_its_path_takes(
    client: TestClient, method: str, path: str, allowed: str
) -> None:
    answer = client.request(method, path, headers=AUTH)
    assert answer.status_code == 405 and answer.headers["allow"] == allowed


def test_the_operators_metrics_port_answers_head_too(storage: str) -> None:
    store = Submissions(storage)
    try:
        with TestClient(create_metrics_app(store, lease_s=30.0)) as scrape:
            got, head = scrape.get("/metrics"), scrape.head("/metrics")
            assert got.status_code == head.status_code == 200 and head.content == b""
            assert scrape.post("/metrics").headers["allow"] == "GET, HEAD"
    finally:
        store.close()


def test_a_404_quotes_a_long_id_or_name_cut_short(client: TestClient) -> None:
    long = "x" * 5000
    for path in (f"/v1/jobs/{long}", f"/v1/studies/{long}"):
        answer = client.get(path, headers=AUTH)
        detail = answer.json()["detail"]
        assert answer.status_code == 404 and len(detail) < 300, detail
        assert "5,000 characters" in detail
    assert (
        "32 lower-case hexadecimal digits"
        in (client.get("/v1/jobs/abc", headers=AUTH).json()["detail"])
    )
    upper = client.get("/v1/jobs/" + "AB" * 16, headers=AUTH).json()["detail"]
    assert "32 lower-case hexadecimal digits" in upper  # it is 32 hexadecimal digits
