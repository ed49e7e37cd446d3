"""Property-based requests generated from the OpenAPI schema (schemathesis): never a 5xx, and
every answer matches the schema's status codes and bodies."""

from __future__ import annotations

from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.api.conftest import make_app
from tests.api.helpers import AUTH, sqlite_url


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory: pytest.TempPathFactory) -> schemathesis.BaseSchema:
    storage = sqlite_url(tmp_path_factory.mktemp("schema"))
    app = make_app(storage, max_queued_per_token=100_000)
    return schemathesis.openapi.from_asgi("/openapi.json", app, headers=AUTH)


schema = schemathesis.pytest.from_fixture("api_schema")


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=list(HealthCheck))
def test_no_request_gets_a_5xx(case: schemathesis.Case) -> None:
    case.call_and_validate(headers=AUTH, checks=[
        not_a_server_error, status_code_conformance, content_type_conformance,
        response_schema_conformance])


def test_the_schema_is_served_with_a_token(api_schema: schemathesis.BaseSchema,
                                          tmp_path: Path) -> None:
    operations = {(op.ok().method.upper(), op.ok().path)
                  for op in api_schema.get_all_operations()}
    assert ("POST", "/v1/jobs") in operations and ("GET", "/healthz") in operations
    assert len(operations) == 13 and ("GET", "/v1/jobs/{job_id}/report") in operations
