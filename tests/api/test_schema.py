"""Property-based requests generated from the OpenAPI schema (schemathesis): never a 5xx, and
every answer matches the schema's status codes, content types and bodies.

The requests go over real HTTP to a uvicorn server on 127.0.0.1, driven by schemathesis' own
CLI (`python -m schemathesis.cli run`). Its pytest plugin broke under pytest 9.2 (`'Function'
object has no attribute '_nodeid'`); the CLI is the interface schemathesis documents first, and
it does not depend on pytest's internals.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.api.conftest import make_app
from tests.api.helpers import AUTH, TOKEN, served, sqlite_url

CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,"
    "response_schema_conformance"
)


@pytest.fixture(scope="module")
def live_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The app on a fresh SQLite file, served by uvicorn in a thread on a free loopback port."""
    storage = sqlite_url(tmp_path_factory.mktemp("schema"))
    app = make_app(storage, max_queued_per_token=100_000)
    with served(app) as port:
        yield f"http://127.0.0.1:{port}"


def run_schemathesis(url: str, report: Path) -> subprocess.CompletedProcess[str]:
    # Runs in the report's folder: schemathesis writes a `.schemathesis/` cache where it starts.
    command = [
        sys.executable,
        "-m",
        "schemathesis.cli",
        "run",
        f"{url}/openapi.json",
        "--checks",
        CHECKS,
        "--header",
        f"Authorization: Bearer {TOKEN}",
        "--max-examples",
        "25",
        "--seed",
        "1",
        "--workers",
        "1",
        "--phases",
        "examples,coverage,fuzzing",
        "--suppress-health-check",
        "all",
        "--generation-database",
        "none",
        "--no-color",
        "--report",
        "ndjson",
        "--report-ndjson-path",
        str(report),
    ]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=900, check=False, cwd=report.parent
    )


@pytest.mark.slow
def test_no_request_gets_a_5xx(live_url: str, tmp_path: Path) -> None:
    report = tmp_path / "events.ndjson"
    result = run_schemathesis(live_url, report)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    # The run really exercised the API: every operation was tested, none was skipped or errored.
    events = [json.loads(line) for line in report.read_text().splitlines() if line.strip()]
    scenarios = [e["ScenarioFinished"] for e in events if "ScenarioFinished" in e]
    fuzzed = {
        s["recorder"]["label"]
        for s in scenarios
        if s["phase"] == "fuzzing" and s["status"] == "success"
    }
    assert len(fuzzed) == 13, sorted(fuzzed)
    assert not [s for s in scenarios if s["status"] in {"failure", "error"}]


def test_the_schema_is_served_with_a_token(live_url: str) -> None:
    schema = httpx.get(f"{live_url}/openapi.json", headers=AUTH, timeout=10).json()
    operations = {
        (method.upper(), path)
        for path, item in schema["paths"].items()
        for method in item
        if method in {"get", "post", "put", "delete", "patch"}
    }
    assert ("POST", "/v1/jobs") in operations and ("GET", "/healthz") in operations
    assert len(operations) == 13 and ("GET", "/v1/jobs/{job_id}/report") in operations
