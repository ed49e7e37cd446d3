"""Bearer tokens: every endpoint but /healthz needs one; 401 says how to send it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pydantic
import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

from api.app import ROUTERS
from api.server import check_exposure, is_loopback
from api.settings import ApiSettings
from tests.api.conftest import make_app
from tests.api.helpers import AUTH, OTHER_AUTH, clean_env
from tuner.errors import TunerError


def _routes() -> list[tuple[str, str]]:
    """(method, path with its parameters filled in) of every route of the app."""
    found = []
    for route in (r for router in ROUTERS for r in router.routes):
        if isinstance(route, APIRoute):
            path = re.sub(r"\{[^}]+\}", "some-id", route.path)
            found += [(method, path) for method in sorted(route.methods)]
    return found


def test_every_endpoint_but_healthz_needs_a_token(client: TestClient) -> None:
    routes = _routes()
    assert ("GET", "/openapi.json") in routes and ("GET", "/metrics") in routes
    for method, path in routes:
        if path in ("/healthz", "/v1/healthz"):
            continue
        for headers in (
            {},
            {"Authorization": "Bearer wrong-token-wrong-token"},
            {"Authorization": "Basic dXNlcjpwYXNz"},
        ):
            response = client.request(method, path, headers=headers)
            assert response.status_code == 401, (method, path, headers, response.text)
            assert response.headers["WWW-Authenticate"] == "Bearer"
            assert "bearer token" in response.json()["detail"]


def test_healthz_needs_no_token(client: TestClient) -> None:
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "no_workers", "database": True, "workers_alive": 0}
    # HEAD too, as load balancers probe (it was 405): the same status, no body.
    for path in ("/healthz", "/v1/healthz"):
        head = client.head(path)
        assert head.status_code == 200 and head.content == b"", (path, head.text)


def test_either_configured_token_is_accepted(client: TestClient) -> None:
    for headers in (AUTH, OTHER_AUTH):
        assert client.get("/v1/jobs", headers=headers).status_code == 200
    assert client.get("/openapi.json", headers=AUTH).json()["info"]["title"] == "streamtune"
    page = client.get("/docs", headers=AUTH).text
    assert "swagger-ui" in page
    # The schema is in the page: its script's own fetch of /openapi.json sends no token, so it
    # had loaded and then failed to show anything (401).
    spec = re.search(r'"spec": (\{.*\}),\n', page)
    assert spec is not None and json.loads(spec.group(1))["info"]["title"] == "streamtune"
    assert client.get("/openapi.json").status_code == 401  # what the page's fetch had met


def test_without_tokens_the_api_is_open(storage: str) -> None:
    with TestClient(make_app(storage, api_tokens="", api_admin_tokens="")) as open_client:
        assert open_client.get("/v1/jobs").status_code == 200


def test_tokens_are_comma_separated_and_must_be_long(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TUNER_API_TOKENS", " aaaaaaaaaaaaaaaa1 , bbbbbbbbbbbbbbbb2 ,")
    assert ApiSettings().token_bytes() == (b"aaaaaaaaaaaaaaaa1", b"bbbbbbbbbbbbbbbb2")
    monkeypatch.setenv("TUNER_API_TOKENS", "short")
    with pytest.raises(pydantic.ValidationError, match="api_tokens"):
        ApiSettings()


def test_serving_beyond_loopback_without_tokens_is_refused() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("gpu-node-3")
    check_exposure("127.0.0.1", ApiSettings(api_tokens=""))
    check_exposure("0.0.0.0", ApiSettings(api_tokens="aaaaaaaaaaaaaaaa1"))
    with pytest.raises(TunerError, match="TUNER_API_TOKENS"):
        check_exposure("0.0.0.0", ApiSettings(api_tokens=""))


def test_serve_command_refuses_and_says_why(tmp_path: object) -> None:
    env = clean_env() | {"TUNER_STORAGE": f"sqlite:///{tmp_path}/refused.db"}
    done = subprocess.run(
        [sys.executable, "-m", "tuner", "serve", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=os.getcwd(),
    )
    assert done.returncode == 2
    assert "refusing to serve on '0.0.0.0' without TUNER_API_TOKENS" in done.stderr
