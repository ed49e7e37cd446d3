"""A job of N > 1 processes per trial through the API: the field's bounds (422 naming it) and a
2-process gloo job of transformer tiny run to the end by a real worker (one trial: each trial is a
torchrun launch of three Python processes); and the wrapper settings a one-process job leaves
out."""

from __future__ import annotations

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.api.conftest import make_worker
from tests.api.helpers import AUTH, TINY_JOB
from trainers import LoopConfig

DP_JOB: dict[str, Any] = {
    "workload": "transformer",
    "preset": "tiny",
    "trials": 1,
    "device": "cpu",
    "fix": {"num_workers": 0},
    "nproc_per_node": 2,
}
# One trial, one final round, two 2-step windows: the fewest launches a job can make.
FEW: dict[str, Any] = {"top_k": 1, "measure_windows": 2, "final_rounds": 1}


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (0, "greater than or equal to 1"),
        (9, "less than or equal to 8"),
        ("2", "valid integer"),
        (2.5, "valid integer"),
        (True, "valid integer"),
    ],
)
def test_a_bad_nproc_per_node_gets_422_naming_it(
    client: TestClient, value: object, message: str
) -> None:
    response = client.post("/v1/jobs", json=DP_JOB | {"nproc_per_node": value}, headers=AUTH)
    assert response.status_code == 422, response.text
    errors = response.json()["detail"]
    assert any(
        e["loc"][:2] == ["body", "nproc_per_node"] and message in e["msg"] for e in errors
    ), errors


def test_a_pin_refused_with_several_processes_gets_422_naming_it(client: TestClient) -> None:
    response = client.post(
        "/v1/jobs",
        json=DP_JOB | {"fix": {"cuda_graph": False, "compile": "reduce-overhead"}},
        headers=AUTH,
    )
    assert response.status_code == 422, response.text
    assert "reduce-overhead" in response.text


def test_a_two_process_job_tunes_end_to_end(client: TestClient, storage: str) -> None:
    created = client.post("/v1/jobs", json=DP_JOB, headers=AUTH)
    assert created.status_code == 201, created.text
    assert created.json()["nproc_per_node"] == 2
    assert make_worker(storage, **FEW).run_once()
    job = client.get(created.headers["Location"], headers=AUTH).json()
    assert job["status"] == "succeeded", job
    assert job["nproc_per_node"] == 2
    trials = client.get(f"{job['links']['trials']}", headers=AUTH).json()["items"]
    assert len(trials) == 1
    assert trials[0]["config"]["parallel"] in ("ddp", "fsdp2")
    best = client.get(job["links"]["best"], headers=AUTH).json()
    config = LoopConfig.from_dict(best["config"])
    assert config.parallel in ("ddp", "fsdp2")
    assert "the ranks agree (world size 2, gloo" in best["parity"]["reason"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("precision", "float8"), ("precisions", ["bf16-autocast", "float8"])],
)
def test_float8_on_a_cpu_job_gets_422_naming_the_field(
    client: TestClient, field: str, value: object
) -> None:
    job = {"workload": "transformer", "preset": "tiny", "device": "cpu", field: value}
    response = client.post("/v1/jobs", json=job, headers=AUTH)
    assert response.status_code == 422, response.text
    errors = response.json()["detail"]
    assert any(e["loc"][:2] == ["body", field] and "float8" in e["msg"] for e in errors), errors
    said = next(e["msg"] for e in errors if e["loc"][:2] == ["body", field])
    assert said.count("device is cpu") == 1, said  # said once, as the job's
    # The same request on a GPU worker's device is accepted: the GPU is checked there.
    accepted = client.post("/v1/jobs", json=job | {"device": "auto"}, headers=AUTH)
    assert accepted.status_code == 201, accepted.text


def test_a_cuda_graph_pinned_on_a_cpu_job_gets_422_naming_it(client: TestClient) -> None:
    job = {"workload": "transformer", "preset": "tiny", "device": "cpu"}
    response = client.post("/v1/jobs", json=job | {"fix": {"cuda_graph": True}}, headers=AUTH)
    assert response.status_code == 422, response.text
    assert "cuda_graph" in response.text and "CUDA device" in response.text


def test_a_one_process_job_says_which_wrapper_settings_its_space_left_out(
    client: TestClient, storage: str
) -> None:
    """A space's notes had reached a client nowhere: not in the job, `/best` or the report,
    only the worker's log (a probe, 2026-12-06). Here DDP's bucket size, inert in one process."""
    body = TINY_JOB | {"trials": 2, "space": {"bucket_cap_mb": [25, 50], "num_streams": [1, 2]}}
    created = client.post("/v1/jobs", json=body, headers=AUTH)
    assert created.status_code == 201, created.text
    assert created.json()["space_notes"] == []  # said once decided
    assert make_worker(storage, **FEW).run_once()
    job = client.get(created.headers["Location"], headers=AUTH).json()
    assert job["status"] == "succeeded", job
    said = [note for note in job["space_notes"] if note.startswith("bucket_cap_mb left out")]
    assert said and "inert with nproc_per_node 1" in said[0], job["space_notes"]
    best = client.get(job["links"]["best"], headers=AUTH).json()
    assert best["search"]["space_notes"] == job["space_notes"]
    report = client.get(job["links"]["report"], headers=AUTH).text
    assert "bucket_cap_mb left out" in report
