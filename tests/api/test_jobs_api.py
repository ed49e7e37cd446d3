"""/v1/jobs through TestClient, without a worker: creating, listing, reading, cancelling, and
every bad input (401 is in test_auth.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import optuna
import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import make_app
from tests.api.helpers import ADMIN_AUTH, AUTH, OTHER_AUTH, TINY_JOB
from tuner.search.proposing.defaults import MAX_PATIENCE, MAX_TRIALS

ROOT = Path(__file__).resolve().parents[2]


def _post(client: TestClient, body: dict[str, Any], headers: dict[str, str] = AUTH) -> Any:
    return client.post("/v1/jobs", json=body, headers=headers)


def test_post_answers_201_with_location_and_the_job(client: TestClient) -> None:
    response = _post(client, TINY_JOB | {"timeout_s": 30, "max_memory_bytes": 2**30})
    assert response.status_code == 201, response.text
    job = response.json()
    assert response.headers["Location"] == f"/v1/jobs/{job['id']}" == job["links"]["self"]
    assert job["status"] == "queued" and job["attempts"] == 0
    assert (job["workload"], job["preset"], job["device"]) == ("mlp", "tiny", "cpu")
    assert (job["trials"], job["n_complete"], job["fastest_trial"]) == (3, 0, None)
    assert "best" not in job  # one name per meaning: `best` is the recommendation (issue 56)
    assert job["space"] == "auto" and job["fix"] == {"num_workers": 0}
    assert job["objectives"] == ["throughput"] and job["timeout_s"] == 30.0
    assert job["study"] == f"job-{job['id']}"
    assert job["links"]["study"] == f"/v1/studies/job-{job['id']}"
    assert job["created_at"].endswith("Z") and job["started_at"] is None
    assert client.get(job["links"]["self"], headers=AUTH).json() == job


def test_a_job_allowing_several_precisions_keeps_them(client: TestClient) -> None:
    """`precisions` is stored with the job and shown as it was asked; `precision` stays unset
    (the run takes the first of them as its reference)."""
    response = _post(client, TINY_JOB | {"precisions": ["fp32", "bf16-autocast"]})
    assert response.status_code == 201, response.text
    job = response.json()
    assert job["precisions"] == ["fp32", "bf16-autocast"] and job["precision"] is None
    assert client.get(job["links"]["self"], headers=AUTH).json()["precisions"] == [
        "fp32",
        "bf16-autocast",
    ]
    plain = _post(client, TINY_JOB).json()
    assert plain["precisions"] is None


def test_a_job_asking_for_gpus_keeps_it_and_all_is_the_default(client: TestClient) -> None:
    job = _post(client, TINY_JOB | {"gpus": 2}).json()
    assert job["gpus"] == 2
    assert client.get(job["links"]["self"], headers=AUTH).json()["gpus"] == 2
    assert _post(client, TINY_JOB).json()["gpus"] == "all"


def test_a_job_asking_to_screen_keeps_it_as_asked(client: TestClient) -> None:
    """`screen` is stored with the job and shown as asked."""
    from tuner.service.spec import JobSpec

    job = _post(client, TINY_JOB | {"screen": "on"}).json()
    assert job["screen"] == "on"
    assert client.get(job["links"]["self"], headers=AUTH).json()["screen"] == "on"
    assert _post(client, TINY_JOB).json()["screen"] == "auto"
    assert JobSpec(workload="mlp", preset="tiny", screen="off").to_stored()["screen"] == "off"


def test_a_job_asking_for_patience_keeps_it_and_a_bad_one_names_the_field(
    client: TestClient,
) -> None:
    """`patience` is the CLI's `--patience`: stored with the job, shown as asked, and a value
    `RunOptions` would refuse is a 422 naming it."""
    job = _post(client, TINY_JOB | {"patience": 3}).json()
    assert job["patience"] == 3
    assert client.get(job["links"]["self"], headers=AUTH).json()["patience"] == 3
    assert _post(client, TINY_JOB).json()["patience"] is None
    two = {"objectives": ["throughput", "memory"]}
    for bad in ({"patience": -1}, {"patience": MAX_PATIENCE + 1}, {"patience": "soon"}):
        response = client.post("/v1/jobs", json=TINY_JOB | bad, headers=AUTH)
        assert response.status_code == 422, response.text
        assert any(e["loc"][:2] == ["body", "patience"] for e in response.json()["detail"])
    # The run's rule, checked before the job is queued: it counts gains in throughput alone.
    response = client.post("/v1/jobs", json=TINY_JOB | two | {"patience": 3}, headers=AUTH)
    assert response.status_code == 422, response.text
    assert "objectives throughput,memory" in response.text and "patience" in response.text
    assert _post(client, TINY_JOB | two | {"patience": 0}).json()["patience"] == 0


def test_list_filters_by_status_and_pages(client: TestClient) -> None:
    ids = [_post(client, TINY_JOB).json()["id"] for _ in range(3)]
    client.post(f"/v1/jobs/{ids[0]}/cancel", headers=AUTH)
    page = client.get("/v1/jobs", params={"limit": 2}, headers=AUTH).json()
    assert (page["total"], page["limit"], page["offset"], len(page["items"])) == (3, 2, 0, 2)
    rest = client.get("/v1/jobs", params={"limit": 2, "offset": 2}, headers=AUTH).json()
    assert {j["id"] for j in page["items"] + rest["items"]} == set(ids)
    queued = client.get("/v1/jobs", params={"status": "queued"}, headers=AUTH).json()
    assert {j["id"] for j in queued["items"]} == set(ids[1:]) and queued["total"] == 2
    cancelled = client.get("/v1/jobs?status=cancelled", headers=AUTH).json()
    assert [j["id"] for j in cancelled["items"]] == [ids[0]]


def test_a_queued_job_has_no_trials_and_no_best_yet(client: TestClient) -> None:
    job = _post(client, TINY_JOB).json()
    trials = client.get(job["links"]["trials"], headers=AUTH)
    assert trials.status_code == 200
    assert trials.json() == {"items": [], "total": 0, "limit": 50, "offset": 0}
    best = client.get(job["links"]["best"], headers=AUTH)
    assert best.status_code == 409
    assert "no recommendation" in best.json()["detail"] and "queued" in best.json()["detail"]


def test_cancel_a_queued_job_then_again(client: TestClient) -> None:
    job = _post(client, TINY_JOB).json()
    cancelled = client.post(job["links"]["cancel"], headers=AUTH)
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled" and cancelled.json()["finished_at"]
    again = client.post(job["links"]["cancel"], headers=AUTH)
    assert again.status_code == 409 and "already cancelled" in again.json()["detail"]


def test_a_jobs_study_without_a_recommendation_says_so_in_the_apis_terms(
    client: TestClient, storage: str
) -> None:
    """A cancelled job's study had advised `python -m tuner run --study ...` from /best, a
    command an API client may have no way to run (a probe, 2026-12-06)."""
    job = _post(client, TINY_JOB).json()
    best = f"/v1/studies/{job['study']}/best"
    # Queued, its study not made yet: a 404 had said no such study (a probe, 2026-12-06).
    unmade = client.get(best, headers=AUTH)
    assert unmade.status_code == 409, unmade.text
    assert f"its job {job['id']} is queued" in unmade.json()["detail"]
    # The study as a worker opens it when the job starts, before any trial is decided.
    optuna.create_study(study_name=job["study"], storage=storage)
    waiting = client.get(best, headers=AUTH)
    assert waiting.status_code == 409, waiting.text
    assert f"its job {job['id']} is queued (GET /v1/jobs/{job['id']}" in waiting.json()["detail"]
    assert client.post(job["links"]["cancel"], headers=AUTH).status_code == 200
    ended = client.get(best, headers=AUTH).json()["detail"]
    assert f"its job {job['id']} ended cancelled before its final round; POST" in ended, ended
    assert "python -m tuner" not in ended
    # A study `python -m tuner run` made keeps the command that finishes it.
    optuna.create_study(study_name="local", storage=storage)
    local = client.get("/v1/studies/local/best", headers=ADMIN_AUTH).json()["detail"]
    assert "python -m tuner run --study local" in local, local


def test_a_jobs_study_not_made_yet_is_a_404_naming_the_job(client: TestClient) -> None:
    """It had been a bare "no study" where the same study's /best is a 409 naming the job (a
    probe, 2026-12-07); queued, then cancelled before a worker claimed it."""
    job = _post(client, TINY_JOB).json()
    # The job's report too: it had said "no study named 'job-…' in this storage".
    for link in (job["links"]["study"], f"/v1/jobs/{job['id']}/report"):
        queued = client.get(link, headers=AUTH)
        assert queued.status_code == 404, queued.text
        assert queued.json()["detail"] == (
            f"study {job['study']!r} is not made yet: a worker makes it when it claims job "
            f"{job['id']}, which is queued (GET /v1/jobs/{job['id']})"
        )
    assert client.post(job["links"]["cancel"], headers=AUTH).status_code == 200
    for link in (job["links"]["study"], f"/v1/jobs/{job['id']}/report"):
        ended = client.get(link, headers=AUTH).json()["detail"]
        assert f"was never made: job {job['id']} ended cancelled before its study was" in ended
    unknown = client.get("/v1/studies/nobody", headers=ADMIN_AUTH)
    assert unknown.status_code == 404 and "never made" not in unknown.json()["detail"]


@pytest.mark.parametrize("path", ["/v1/jobs/{id}", "/v1/jobs/{id}/trials", "/v1/jobs/{id}/best"])
@pytest.mark.parametrize("job_id", ["0" * 32, "nope", "x" * 300, "j%C3%B6b"])
def test_unknown_jobs_are_404(client: TestClient, path: str, job_id: str) -> None:
    response = client.get(path.format(id=job_id), headers=AUTH)
    assert response.status_code == 404
    assert "no job with id" in response.json()["detail"]


def test_cancel_an_unknown_job_is_404(client: TestClient) -> None:
    assert client.post("/v1/jobs/abc/cancel", headers=AUTH).status_code == 404


def test_a_token_with_too_many_queued_jobs_gets_429(storage: str) -> None:
    with TestClient(make_app(storage, max_queued_per_token=2)) as client:
        assert [_post(client, TINY_JOB).status_code for _ in range(2)] == [201, 201]
        refused = _post(client, TINY_JOB)
        assert refused.status_code == 429
        assert "2 queued jobs" in refused.json()["detail"]
        assert refused.headers["Retry-After"]
        # Another token has its own count; a cancelled job frees a place.
        assert _post(client, TINY_JOB, OTHER_AUTH).status_code == 201
        first = client.get("/v1/jobs?status=queued", headers=AUTH).json()["items"][-1]
        client.post(first["links"]["cancel"], headers=AUTH)
        assert _post(client, TINY_JOB).status_code == 201


def test_bodies_over_64_kib_get_413(client: TestClient) -> None:
    big = json.dumps(TINY_JOB | {"padding": "x" * (64 * 1024)})
    response = client.post(
        "/v1/jobs", content=big, headers=AUTH | {"Content-Type": "application/json"}
    )
    assert response.status_code == 413
    assert "65536 bytes" in response.json()["detail"]

    def chunks() -> Iterator[bytes]:  # no Content-Length: the limit counts what arrives
        for _ in range(80):
            yield b" " * 1024

    chunked = client.post(
        "/v1/jobs", content=chunks(), headers=AUTH | {"Content-Type": "application/json"}
    )
    assert chunked.status_code == 413
    # Just under the limit is parsed as usual (here: a 422 for the unknown field).
    fits = json.dumps(TINY_JOB | {"padding": "x" * (60 * 1024)})
    assert (
        client.post(
            "/v1/jobs", content=fits, headers=AUTH | {"Content-Type": "application/json"}
        ).status_code
        == 422
    )


BAD_BODIES: list[tuple[dict[str, Any], tuple[Any, ...], str]] = [
    # (changes to TINY_JOB, the error's loc must start with this, its message must hold this)
    ({"trials": 0}, ("body", "trials"), "greater than or equal to 1"),
    ({"trials": MAX_TRIALS + 1}, ("body", "trials"), f"less than or equal to {MAX_TRIALS}"),
    ({"trials": "5"}, ("body", "trials"), "valid integer"),
    ({"code": "import os"}, ("body", "code"), "unknown field 'code': allowed workload, preset"),
    ({"trial": 3}, ("body", "trial"), "unknown field 'trial' (did you mean trials"),
    ({"n_trials": 3}, ("body", "n_trials"), "'n_trials' is another name of 'trials', which is"),
    ({"workload": "os.path:join"}, ("body", "workload"), "pattern"),
    # A wrapper's settings alone with one process: refused here, not failed at the worker.
    ({"space": {"bucket_cap_mb": [25, 50]}}, ("body", "space"), "inert with nproc_per_node 1"),
    # The CLI's module path: the operator registers it under a name (a probe, 2026-12-06).
    ({"workload": "my_models.nets:build"}, ("body", "workload"), "registers one under a name"),
    ({"workload": "mymodels:build"}, ("body", "workload"), "is not taken over the API"),
    ({"workload": "resnet"}, ("body", "workload"), "unknown workload 'resnet'"),
    # The allowed list whole: a message cut at 200 characters had lost the library families.
    ({"workload": "a" * 100}, ("body", "workload"), "hf:masked-lm, hf:seq-cls)"),
    ({"preset": "enormous"}, ("body", "preset"), "no preset 'enormous'"),
    ({"space": "everything"}, ("body", "space"), "'streams', 'compile' or 'scale'"),
    ({"model_args": {"batch": "4"}}, ("body", "model_args"), "takes no model_args"),
    # A JSON number is taken as its text, as the CLI takes `--model-arg batch=4`.
    ({"model_args": {"batch": 4}}, ("body", "model_args"), "takes no model_args"),
    ({"model_args": {"Batch!": "4"}}, ("body", "model_args"), "pattern"),
    ({"precision": "fp64"}, ("body", "precision"), "'fp16-autocast' or 'float8'"),
    ({"precisions": ["fp32", "fp64"]}, ("body", "precisions"), "'fp16-autocast' or 'float8'"),
    ({"precisions": ["fp32", "fp32"]}, ("body", "precisions"), "each precision once"),
    ({"precisions": []}, ("body", "precisions"), "at least 1"),
    (
        {"precision": "tf32", "precisions": ["fp32", "bf16-autocast"]},
        ("body", "precision"),
        "one of precisions (fp32, bf16-autocast)",
    ),
    (
        {"precisions": ["fp32", "bf16-autocast"], "nproc_per_node": 2},
        ("body", "precisions"),
        "one precision with nproc_per_node > 1",
    ),
    ({"workload": "nope:model"}, ("body", "workload"), "unknown workload 'nope:model'"),
    ({"space": {"compile": ["fast"]}}, ("body", "space", "compile", 0), "'default'"),
    (
        {"space": {"num_streams": {"low": 3, "high": 2}}},
        ("body", "space", "num_streams"),
        "low <= high",
    ),
    ({"space": {"num_streams": {"low": 1, "high": 9}}}, ("body", "space", "num_streams"), "1..4"),
    ({"space": {"num_streams": [1, 9]}}, ("body", "space", "num_streams", 1), "4"),
    (
        {"space": {"sync_interval": {"low": 0, "high": 8, "log": True}}},
        ("body", "space", "sync_interval"),
        "low >= 1",
    ),
    (
        {"space": {"warp_drive": [1, 2]}},
        ("body", "space", "warp_drive"),
        "unknown field 'warp_drive': allowed num_streams, sync_interval",
    ),
    ({"space": {"num_streams": 2}}, ("body", "space"), "at least one searched setting"),
    # Pins that leave an explicit space nothing to search: as a space of one value each.
    (
        {"space": {"num_streams": [1, 2]}, "fix": {"num_streams": 3}},
        ("body", "fix"),
        "these fix every setting it searches (num_streams)",
    ),
    # Refused as the CLI refuses it; it had been queued, then failed once a worker built it.
    (
        {"nproc_per_node": 3},
        ("body", "nproc_per_node"),
        "allowed a divisor of the global batch (mlp tiny has 16 samples per batch",
    ),
    # A list of one, or a range of one value, searches nothing either (the range was queued).
    ({"space": {"num_streams": [2]}}, ("body", "space"), "two or more choices"),
    ({"space": {"num_streams": {"low": 2, "high": 2}}}, ("body", "space"), "low < high"),
    ({"space": {"cuda_graph": [True]}}, ("body", "space", "cuda_graph"), "CUDA"),
    ({"fix": {"warp_drive": 1}}, ("body", "fix", "warp_drive"), "unknown field 'warp_drive'"),
    ({"fix": {"settings": 1}}, ("body", "fix", "settings"), "unknown field 'settings'"),
    ({"choices": 1}, ("body", "choices"), "unknown field 'choices': allowed workload"),
    ({"fix": {"num_stream": 1}}, ("body", "fix", "num_stream"), "(did you mean num_streams?)"),
    ({"fix": {"num_streams": 7}}, ("body", "fix", "num_streams"), "less than or equal to 4"),
    ({"fix": {"cuda_graph": True}}, ("body", "fix", "cuda_graph"), "CUDA"),
    (
        {"device": "cuda", "precision": "float8"}
        | {"fix": {"float8_linears": "none", "float8_head": "bf16"}},
        ("body", "fix", "float8_linears"),
        "float8_head='float8'",
    ),
    (  # fixed by the space, not pinned: the space's
        {"device": "cuda", "precision": "float8"}
        | {"space": {"num_streams": [1, 2], "float8_linears": "none", "float8_head": "bf16"}},
        ("body", "space", "float8_linears"),
        "float8_head='float8'",
    ),
    (
        {"device": "cuda", "precision": "bf16-autocast", "fix": {"float8_head": "float8"}},
        ("body", "fix", "float8_head"),
        "float8",
    ),
    ({"objectives": ["memory"]}, ("body", "objectives"), "throughput"),
    ({"objectives": ["throughput", "throughput"]}, ("body", "objectives"), "throughput"),
    ({"objectives": []}, ("body", "objectives"), "at least 1"),
    ({"device": "tpu"}, ("body", "device"), "allowed auto, cpu, cuda or cuda:INDEX, not 'tpu'"),
    ({"device": "cuda:1000"}, ("body", "device"), "allowed auto, cpu, cuda or cuda:INDEX, not"),
    ({"device": "cuda:01"}, ("body", "device"), "allowed auto, cpu, cuda or cuda:INDEX, not"),
    ({"screen": "sometimes"}, ("body", "screen"), "'auto', 'on' or 'off'"),
    ({"screen": True}, ("body", "screen"), "'auto', 'on' or 'off'"),
    ({"gpus": 0}, ("body", "gpus"), "allowed 'all' or a whole number 1..64"),
    ({"gpus": 65}, ("body", "gpus"), "allowed 'all' or a whole number 1..64"),
    ({"gpus": "every"}, ("body", "gpus"), "allowed 'all' or a whole number 1..64"),
    ({"gpus": True}, ("body", "gpus"), "allowed 'all' or a whole number 1..64"),
    ({"gpus": 1.5}, ("body", "gpus"), "allowed 'all' or a whole number 1..64"),
    ({"timeout_s": 0}, ("body", "timeout_s"), "greater than 0"),
    ({"max_memory_bytes": 0}, ("body", "max_memory_bytes"), "greater than or equal to 1"),
]


@pytest.mark.parametrize(
    ("changes", "loc", "message"), BAD_BODIES, ids=[json.dumps(c)[:60] for c, _, _ in BAD_BODIES]
)
def test_bad_bodies_get_422_naming_the_field(
    client: TestClient, changes: dict[str, Any], loc: tuple[Any, ...], message: str
) -> None:
    response = _post(client, TINY_JOB | changes)
    assert response.status_code == 422, response.text
    errors = response.json()["detail"]
    assert any(tuple(e["loc"][: len(loc)]) == loc and message in e["msg"] for e in errors), errors
    # Pydantic's "Value error, " before our own sentences is left out (gpus' read so).
    assert not any(e["msg"].startswith("Value error") for e in errors), errors
    assert client.get("/v1/jobs", headers=AUTH).json()["total"] == 0


@pytest.mark.parametrize(
    ("space", "loc", "message"),
    [
        ({"num_streams": [9]}, ["body", "space", "num_streams", 0], "less than or equal to 4"),
        ({"num_streams": "2"}, ["body", "space", "num_streams"], "valid integer"),
        ({"num_streams": {"low": 1}}, ["body", "space", "num_streams", "high"], "required"),
        ({"compile": {"low": 1}}, ["body", "space", "compile"], "one value or a list of choices"),
        ({"pin_memory": [True, 3]}, ["body", "space", "pin_memory", 1], "valid boolean"),
        # A client's key that reads as a tag stays where it was sent (a probe, 2026-12-06).
        (
            {"num_streams": {"low": 1, "high": 2, "choices": [1, 2]}},
            ["body", "space", "num_streams", "choices"],
            "unknown field 'choices': allowed low, high, log",
        ),
        ({"settings": [1, 2]}, ["body", "space", "settings"], "unknown field 'settings'"),
        ("everything", ["body", "space"], "'compile' or 'scale'"),
        (5, ["body", "space"], "or an object of settings"),
    ],
)
def test_a_bad_space_gets_one_error_naming_the_setting_as_it_was_sent(
    client: TestClient, space: object, loc: list[Any], message: str
) -> None:
    """`{"num_streams": [9]}` had answered four errors, one per reading pydantic tried (the
    built-in names, one value, a list, a range), with `SpaceIn` and `list[constrained-int]` in
    their loc (a probe, 2026-12-06): only the reading its JSON type says is checked now."""
    errors = _post(client, TINY_JOB | {"space": space}).json()["detail"]
    assert len(errors) == 1 and errors[0]["loc"] == loc, errors
    assert message in errors[0]["msg"], errors


def test_missing_fields_and_broken_json_get_422(client: TestClient) -> None:
    missing = _post(client, {"preset": "tiny"}).json()["detail"]
    assert [e["loc"] for e in missing] == [["body", "workload"]]
    broken = client.post(
        "/v1/jobs", content=b'{"workload": ', headers=AUTH | {"Content-Type": "application/json"}
    )
    assert broken.status_code == 422 and broken.json()["detail"][0]["loc"][0] == "body"


@pytest.mark.parametrize(
    ("query", "loc"),
    [
        ({"limit": 0}, ["query", "limit"]),
        ({"limit": 201}, ["query", "limit"]),
        ({"offset": -1}, ["query", "offset"]),
        ({"status": "sleeping"}, ["query", "status"]),
    ],
)
def test_bad_queries_get_422_naming_the_parameter(
    client: TestClient, query: dict[str, Any], loc: list[str]
) -> None:
    response = client.get("/v1/jobs", params=query, headers=AUTH)
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == loc


@pytest.mark.models
def test_a_library_model_is_checked_before_it_is_queued(client: TestClient) -> None:
    pytest.importorskip("transformers")
    body = TINY_JOB | {
        "workload": "hf:causal-lm",
        "model_args": {"layers": "2"},
        "precision": "bf16-autocast",
    }
    created = _post(client, body)
    assert created.status_code == 201, created.text
    job = created.json()
    assert (job["model_args"], job["precision"]) == ({"layers": "2"}, "bf16-autocast")
    bad = _post(client, body | {"model_args": {"layerz": "2"}})
    assert bad.status_code == 422
    assert any(
        e["loc"][:2] == ["body", "model_args"] and "layerz" in e["msg"]
        for e in bad.json()["detail"]
    ), bad.json()
    # The 422 echoes the value at fault (it echoed the workload's name).
    typed = _post(client, body | {"model_args": {"layers": "two"}})
    assert typed.status_code == 422
    (error,) = typed.json()["detail"]
    assert (error["loc"], error["input"]) == (["body", "model_args", "layers"], "two"), error
    preset = _post(client, body | {"preset": "enormous"})
    assert preset.status_code == 422 and preset.json()["detail"][0]["input"] == "enormous"
    # Options that only fail together (heads must divide the width) are refused before the job
    # is queued, as `run` refuses them: it was queued, then failed in its worker.
    shape = _post(client, body | {"model_args": {"hidden": "30", "heads": "4"}})
    assert shape.status_code == 422, shape.text
    (error,) = shape.json()["detail"]
    assert error["loc"] == ["body", "model_args", "heads"] and "a divisor of hidden" in error["msg"]


@pytest.mark.models
def test_model_args_take_json_numbers_and_booleans_as_the_cli_takes_their_text(
    client: TestClient,
) -> None:
    # `{"layers": 2}` was "Input should be a valid string": a client's natural JSON was refused
    # by a type rule, and an unknown key's own error was hidden behind it.
    pytest.importorskip("transformers")
    body = TINY_JOB | {"workload": "hf:causal-lm", "precision": "bf16-autocast"}
    typed = _post(client, body | {"model_args": {"layers": 2, "tie": True, "heads": " 4 "}})
    assert typed.status_code == 201, typed.text
    assert typed.json()["model_args"] == {"layers": "2", "tie": "true", "heads": "4"}
    for args, key, words in [
        ({"layers": 2.5}, "layers", "an integer"),
        ({"layerz": 2}, "model_args", "layerz"),
        ({"layers": None}, "layers", "valid string"),
    ]:
        bad = _post(client, body | {"model_args": args})
        assert bad.status_code == 422, (args, bad.text)
        assert any(key in e["loc"] and words in e["msg"] for e in bad.json()["detail"]), bad.json()


def test_the_schema_says_model_args_take_numbers_and_booleans(client: TestClient) -> None:
    """A client generated from the schema refused `{"batch": 64}` the service takes (a new API
    client's trial): the schema lists each type a value may be sent as."""
    schema = client.get("/openapi.json", headers=AUTH).json()
    value = schema["components"]["schemas"]["JobIn"]["properties"]["model_args"]
    value = value.get("additionalProperties") or next(iter(value["patternProperties"].values()))
    sent = {part.get("type") for part in value["anyOf"]}
    assert sent == {"string", "integer", "number", "boolean"}, value
    text = next(part for part in value["anyOf"] if part.get("type") == "string")
    assert (text["minLength"], text["maxLength"]) == (1, 64) and text["pattern"]


def test_a_job_names_a_program_of_the_servers_registry_never_its_command(storage: str) -> None:
    registry = str(ROOT / "examples" / "program" / "programs.json")
    job = {"workload": "program:plain-mlp", "preset": "tiny", "trials": 2, "device": "cpu"}
    with TestClient(make_app(storage, programs=registry)) as with_programs:
        created = _post(with_programs, job)
        assert created.status_code == 201, created.text
        assert created.json()["workload"] == "program:plain-mlp"
        for changes, loc, message in [
            ({"workload": "program:nope"}, ("body", "workload"), "program:plain-mlp"),
            ({"preset": "huge"}, ("body", "preset"), "no preset 'huge': allowed tiny, small"),
            ({"preset": "smal"}, ("body", "preset"), "tiny, small (did you mean small?)"),
            ({"fix": {"num_streams": 2}}, ("body", "fix"), "does not implement num_streams"),
            ({"command": ["rm", "-rf", "/"]}, ("body", "command"), "unknown field 'command'"),
        ]:
            response = _post(with_programs, job | changes)
            assert response.status_code == 422, response.text
            errors = response.json()["detail"]
            assert any(
                tuple(e["loc"][: len(loc)]) == loc and message in e["msg"] for e in errors
            ), errors
    with TestClient(make_app(storage)) as without:
        refused = _post(without, job)
        assert refused.status_code == 422 and "unknown workload 'program:plain-mlp'" in refused.text


def test_a_registry_broken_after_start_fails_only_program_jobs_and_a_space_it_cannot_search(
    storage: str, tmp_path: Path
) -> None:
    """A probe (2026-12-06): an edited registry made every POST a 500, built-ins too; a program
    job whose space holds only settings the program lacks was queued (201), then failed."""
    registry = tmp_path / "programs.json"
    for name in ("programs.json", "plain_loop.py"):
        (tmp_path / name).write_bytes((ROOT / "examples" / "program" / name).read_bytes())
    job = {"workload": "program:plain-mlp", "preset": "tiny", "trials": 2, "device": "cpu"}
    with TestClient(make_app(storage, programs=str(registry))) as client:
        refused = _post(client, job | {"space": {"num_streams": [1, 2]}})
        assert refused.status_code == 422, refused.text
        (error,) = refused.json()["detail"]
        assert error["loc"][:2] == ["body", "space"]
        assert "program 'plain-mlp' implements sync_interval" in error["msg"]
        assert _post(client, job | {"space": {"sync_interval": [1, 4]}}).status_code == 201
        registry.write_text("{not json")
        assert _post(client, TINY_JOB).status_code == 201
        broken = _post(client, job)
        assert broken.status_code == 422, broken.text
        assert "the server's program registry cannot be read now" in broken.text
