"""A token sees only its own jobs (issue 27): another token's job, its trials, best config,
report, study and cancel are a 404 (existence does not leak); admin tokens see and cancel
everything; studies and recommendations are filtered the same way; tokens have names, which the
job row and the logs show (never the token). On SQLite and PostgreSQL."""

from __future__ import annotations

import logging
from typing import Any

import optuna
import pydantic
import pytest
from fastapi.testclient import TestClient

from api.server import check_exposure
from api.settings import ApiSettings
from tests.api.conftest import make_app
from tests.api.helpers import ADMIN_AUTH, AUTH, OTHER_AUTH, OTHER_TOKEN, TINY_JOB, TOKEN
from tuner.errors import TunerError
from tuner.service.jobstore import JobStore
from tuner.service.owners import owner_of
from tuner.service.settings import load_settings
from tuner.service.spec import JobSpec

JOB_PATHS = ("", "/trials", "/best", "/report")


def _post(client: TestClient, headers: dict[str, str], **changes: Any) -> dict[str, Any]:
    response = client.post("/v1/jobs", json=TINY_JOB | changes, headers=headers)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


def _finish(storage: str, job_id: str, throughput: float) -> None:
    """End a job as a worker does, with a recommendation on the CPU, and give it its study."""
    store = JobStore(storage)
    store.register_worker("w", host="test", pid=1, device="cpu")
    claimed = store.claim("w", devices=("cpu",))
    assert claimed is not None and claimed.id == job_id
    optuna.create_study(study_name=claimed.study, storage=storage)
    rec = {
        "study": claimed.study,
        "config": {"num_streams": 1},
        "hardware": "cpu",
        "throughput": {"median": throughput, "ci95": [throughput - 1, throughput + 1]},
    }
    assert store.finish(job_id, "w", "succeeded", recommendation=rec)
    store.remove_worker("w")
    store.close()


def test_another_tokens_job_is_not_found_and_not_cancelled(any_storage: str) -> None:
    with TestClient(make_app(any_storage)) as client:
        mine = _post(client, AUTH)
        base = f"/v1/jobs/{mine['id']}"
        for path in JOB_PATHS:
            response = client.get(base + path, headers=OTHER_AUTH)
            assert response.status_code == 404, (path, response.text)
            assert response.json()["detail"] == f"no job with id {mine['id']!r}"
        refused = client.post(f"{base}/cancel", headers=OTHER_AUTH)
        assert refused.status_code == 404
        assert refused.json() == client.post("/v1/jobs/0123/cancel", headers=OTHER_AUTH).json() | {
            "detail": f"no job with id {mine['id']!r}"
        }
        assert client.get(base, headers=AUTH).json()["status"] == "queued"  # not cancelled
        assert client.get(f"{base}/trials", headers=AUTH).status_code == 200
        assert client.get("/v1/jobs", headers=OTHER_AUTH).json()["total"] == 0
        listed = client.get("/v1/jobs", headers=AUTH).json()
        assert [j["id"] for j in listed["items"]] == [mine["id"]]
        assert client.post(f"{base}/cancel", headers=AUTH).json()["status"] == "cancelled"


def test_an_admin_token_sees_and_cancels_every_job(any_storage: str) -> None:
    with TestClient(make_app(any_storage)) as client:
        first = _post(client, AUTH)
        second = _post(client, OTHER_AUTH)
        everything = client.get("/v1/jobs", headers=ADMIN_AUTH).json()
        assert {j["id"] for j in everything["items"]} == {first["id"], second["id"]}
        assert client.get(f"/v1/jobs/{first['id']}", headers=ADMIN_AUTH).status_code == 200
        cancelled = client.post(f"/v1/jobs/{second['id']}/cancel", headers=ADMIN_AUTH)
        assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
        own = _post(client, ADMIN_AUTH)
        assert client.get(f"/v1/jobs/{own['id']}", headers=AUTH).status_code == 404


def test_studies_and_recommendations_show_only_what_the_callers_jobs_made(
    any_storage: str,
) -> None:
    optuna.create_study(study_name="local-run", storage=any_storage)  # `tuner run`'s
    with TestClient(make_app(any_storage)) as client:
        mine, theirs = _post(client, AUTH), _post(client, OTHER_AUTH)
        _finish(any_storage, mine["id"], throughput=10.0)
        _finish(any_storage, theirs["id"], throughput=99.0)  # faster, but not mine

        def names(headers: dict[str, str]) -> list[str]:
            page = client.get("/v1/studies", headers=headers).json()
            assert page["total"] == len(page["items"])
            return [s["name"] for s in page["items"]]

        assert names(AUTH) == [mine["study"]] and names(OTHER_AUTH) == [theirs["study"]]
        assert names(ADMIN_AUTH) == sorted([mine["study"], theirs["study"], "local-run"])
        for path in (f"/v1/studies/{theirs['study']}", f"/v1/studies/{theirs['study']}/best"):
            hidden = client.get(path, headers=AUTH)
            assert hidden.status_code == 404
            assert hidden.json()["detail"] == f"no study named {theirs['study']!r} in this storage"
            # Its owner reads it (its study holds no recommendation: /best is a 409, not a 404).
            expected = 409 if path.endswith("/best") else 200
            assert client.get(path, headers=OTHER_AUTH).status_code == expected
        assert client.get("/v1/studies/local-run", headers=AUTH).status_code == 404
        assert client.get("/v1/studies/local-run", headers=ADMIN_AUTH).status_code == 200
        # A name `--study` takes with '?' and '#' in it: its links fetch it (unquoted, they had
        # named another path, a probe, 2026-12-07). Not '%': the test client unquotes twice.
        optuna.create_study(study_name="odd ?#x", storage=any_storage)
        (odd,) = [s for s in client.get("/v1/studies", headers=ADMIN_AUTH).json()["items"]
                  if s["name"] == "odd ?#x"]  # fmt: skip
        assert odd["links"]["self"] == "/v1/studies/odd%20%3F%23x"
        fetched = client.get(odd["links"]["self"], headers=ADMIN_AUTH)
        assert fetched.status_code == 200 and fetched.json()["name"] == "odd ?#x", fetched.text
        assert client.get(odd["links"]["best"], headers=ADMIN_AUTH).status_code == 409

        query = {"workload": "mlp", "preset": "tiny", "gpu": "cpu"}
        hits = {
            who: client.get("/v1/recommendations", params=query, headers=headers).json()
            for who, headers in (("a", AUTH), ("b", OTHER_AUTH), ("admin", ADMIN_AUTH))
        }
        assert hits["a"]["job_id"] == mine["id"] and hits["a"]["throughput"] == 10.0
        assert hits["b"]["job_id"] == theirs["id"]
        assert hits["admin"]["job_id"] == theirs["id"]  # the fastest of all
        # A third token, with no job of its own, finds none.
        with TestClient(make_app(any_storage, api_tokens=f"carol:{'c' * 20}")) as carols:
            none = carols.get(
                "/v1/recommendations", params=query, headers={"Authorization": f"Bearer {'c' * 20}"}
            )
            assert none.status_code == 404


def test_a_named_token_stores_its_name_and_logs_it_never_the_token(
    any_storage: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    tokens = f"alice:{TOKEN},bob:{OTHER_TOKEN}"
    with TestClient(make_app(any_storage, api_tokens=tokens)) as client:
        job = _post(client, AUTH)
        assert client.post(f"/v1/jobs/{job['id']}/cancel", headers=AUTH).status_code == 200
        assert client.get(f"/v1/jobs/{job['id']}", headers=OTHER_AUTH).status_code == 404
    row = JobStore(any_storage).get(job["id"])
    assert row.owner == "alice"
    stored = " ".join(str(getattr(row, c.key)) for c in row.__mapper__.column_attrs)
    assert TOKEN not in stored and owner_of(TOKEN) not in stored
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert f"job {job['id']} queued by alice" in logged
    assert f"job {job['id']}: cancel asked by alice" in logged
    assert TOKEN not in logged and OTHER_TOKEN not in logged


def test_a_token_named_later_keeps_the_jobs_stored_under_its_hash(any_storage: str) -> None:
    store = JobStore(any_storage)
    old = store.create(JobSpec(**(TINY_JOB | {"trials": 3})), owner=owner_of(TOKEN))
    with TestClient(make_app(any_storage, api_tokens=f"alice:{TOKEN},{OTHER_TOKEN}")) as client:
        assert client.get(f"/v1/jobs/{old.id}", headers=AUTH).status_code == 200
        assert client.get(f"/v1/jobs/{old.id}", headers=OTHER_AUTH).status_code == 404
        assert client.get("/v1/jobs", headers=AUTH).json()["total"] == 1


def test_token_settings_name_tokens_and_refuse_repeats() -> None:
    settings = ApiSettings(api_tokens=f"alice:{TOKEN}, {OTHER_TOKEN}", api_admin_tokens="")
    alice, bare = settings.tokens()
    assert (alice.owner.name, alice.secret, alice.owner.admin) == ("alice", TOKEN.encode(), False)
    assert bare.owner.name == owner_of(OTHER_TOKEN) and bare.secret == OTHER_TOKEN.encode()
    admin = ApiSettings(api_admin_tokens=f"ops:{'o' * 16}").tokens()[0]
    assert admin.owner.admin and admin.owner.name == "ops"
    for tokens, admins, message in [
        (f"alice:{TOKEN},alice:{OTHER_TOKEN}", "", "a name is given twice"),
        (f"alice:{TOKEN}", f"ops:{TOKEN}", "a token is given twice"),
        ("alice:short", "", "at least 16 characters"),
        # A bad NAME had made the whole entry a bare token: `Bearer TOKEN` was refused.
        (
            f"bad name!:{TOKEN}",
            "",
            "needs a NAME of 1-64 letters, digits and _.@-, not 'bad name!'",
        ),
        ("", f":{TOKEN}", "needs a NAME of 1-64 letters"),
    ]:
        with pytest.raises(pydantic.ValidationError, match=message):
            ApiSettings(api_tokens=tokens, api_admin_tokens=admins)
    check_exposure("0.0.0.0", ApiSettings(api_tokens="", api_admin_tokens=f"ops:{'o' * 16}"))
    with pytest.raises(TunerError, match="TUNER_API_TOKENS"):
        check_exposure("0.0.0.0", ApiSettings(api_tokens="", api_admin_tokens=""))


def test_repeated_tokens_in_the_environment_are_one_line_naming_both_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A check of both variables has no single field: reading its name had raised IndexError.
    monkeypatch.setenv("TUNER_API_TOKENS", f"a:{TOKEN},b:{TOKEN}")
    with pytest.raises(TunerError) as caught:
        load_settings(ApiSettings)
    assert str(caught.value) == (
        "TUNER_API_TOKENS, TUNER_API_ADMIN_TOKENS: a token is given twice (each token and each "
        "name once, across both)"
    )
    monkeypatch.setenv("TUNER_API_TOKENS", f"bad name!:{TOKEN}")
    with pytest.raises(TunerError, match=r"^TUNER_API_TOKENS: an entry NAME:TOKEN needs a NAME"):
        load_settings(ApiSettings)
