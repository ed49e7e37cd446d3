"""The API while PostgreSQL is unreachable: 503 with Retry-After on every route, not 500; and
back to normal once it is reachable again. The app reaches the server through a proxy that the
test cuts (tests/api/proxy.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import make_app
from tests.api.helpers import AUTH, TINY_JOB
from tests.api.proxy import Proxy

pytestmark = pytest.mark.postgres


@pytest.fixture
def proxied(pg_url: str) -> Iterator[tuple[str, Proxy]]:
    proxy = Proxy(("127.0.0.1", 5432))
    try:
        yield pg_url.replace("127.0.0.1:5432", f"127.0.0.1:{proxy.port}"), proxy
    finally:
        proxy.cut()


def test_every_route_answers_503_while_the_database_is_unreachable(
    proxied: tuple[str, Proxy],
) -> None:
    url, proxy = proxied
    with TestClient(make_app(url), raise_server_exceptions=False) as client:
        job = client.post("/v1/jobs", json=TINY_JOB, headers=AUTH).json()
        study = job["study"]
        requests = [
            ("GET", "/v1/jobs", None),
            ("GET", f"/v1/jobs/{job['id']}", None),
            ("GET", f"/v1/jobs/{job['id']}/trials", None),
            ("GET", f"/v1/jobs/{job['id']}/best", None),
            ("POST", f"/v1/jobs/{job['id']}/cancel", None),
            ("POST", "/v1/jobs", TINY_JOB),
            ("GET", "/v1/studies", None),
            ("GET", f"/v1/studies/{study}", None),
            ("GET", f"/v1/studies/{study}/best", None),
            ("GET", "/v1/recommendations?workload=mlp&preset=tiny&gpu=cpu", None),
            ("GET", "/healthz", None),
            ("GET", "/metrics", None),
        ]
        before = {
            path: client.request(m, path, json=body, headers=AUTH).status_code
            for m, path, body in requests
            if m == "GET"
        }
        assert all(code < 500 for code in before.values()), before
        proxy.cut()
        for method, path, body in requests:
            response = client.request(method, path, json=body, headers=AUTH)
            assert response.status_code == 503, (method, path, response.text)
            if path != "/healthz":  # its body is the health report
                assert response.headers["Retry-After"] == "5", path
                assert "database is unavailable" in response.json()["detail"]
        proxy.restore()
        after = {path: client.get(path, headers=AUTH).status_code for path in before}
        assert after == before
