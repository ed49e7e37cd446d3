"""The job store's contract, one suite run on every backend (SQLite and PostgreSQL), the way Optuna
runs one storage test suite over each of its storages.

Each test gets a fresh database: a file under tmp_path, or a PostgreSQL schema of its own
(`pg_url`, skipped when nothing listens on 127.0.0.1:5432).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

import trainers
from tests.conftest import pg_listening
from tuner.errors import JobConflict, JobNotFound, SpecError, TooManyQueued
from tuner.service.jobstore import JobStore
from tuner.service.spec import JobSpec, WorkloadRegistry, check_spec
from tuner.service.tables import JobRow, WorkerRow
from tuner.store.counting import TrialCounts

TINY = {"workload": "mlp", "preset": "tiny", "trials": 3, "device": "cpu"}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: object) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/jobs.db"
    if not pg_listening():
        pytest.skip("PostgreSQL is not reachable on 127.0.0.1:5432")
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def store(url: str) -> Iterator[JobStore]:
    opened = JobStore(url)
    yield opened
    opened.close()


def register(store: JobStore, *names: str) -> None:
    for name in names:
        store.register_worker(name, host="test", pid=1, device="cpu")


def test_concurrent_claims_take_each_job_once(url: str, store: JobStore) -> None:
    ids = {store.create(JobSpec(**TINY), owner="me").id for _ in range(12)}
    register(store, *(f"w{i}" for i in range(4)))
    claimed: list[str] = []
    lock = threading.Lock()

    def claim_all(name: str) -> None:
        mine = JobStore(url)
        while (job := mine.claim(name, devices=("cpu", "auto"))) is not None:
            with lock:
                claimed.append(job.id)
        mine.close()

    threads = [threading.Thread(target=claim_all, args=(f"w{i}",)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(claimed) == sorted(ids)  # every job once: none twice, none missed


def test_on_postgresql_the_claim_skips_locked_rows(url: str, store: JobStore) -> None:
    if not url.startswith("postgresql"):
        pytest.skip("SKIP LOCKED is PostgreSQL's; SQLite's claim takes the one writer lock")
    store.create(JobSpec(**TINY), owner="me")
    statements: list[str] = []
    sa.event.listen(
        store.engine,
        "before_cursor_execute",
        lambda _c, _r, statement, *_: statements.append(statement),
    )
    assert store.claim("w", devices=("cpu",)) is not None
    claim = next(s for s in statements if s.lstrip().upper().startswith("UPDATE"))
    assert "FOR UPDATE SKIP LOCKED" in claim and "RETURNING" in claim


def test_the_claim_takes_the_oldest_job_of_a_device_it_runs(store: JobStore) -> None:
    register(store, "w")
    first = store.create(JobSpec(**TINY), owner="me")
    store.create(JobSpec(**(TINY | {"device": "cuda"})), owner="me")
    second = store.create(JobSpec(**TINY), owner="me")
    assert [store.claim("w", devices=("cpu",)).id for _ in range(2)] == [first.id, second.id]
    assert store.claim("w", devices=("cpu",)) is None
    row = store.get(first.id)
    assert (row.status, row.worker, row.attempts) == ("running", "w", 1)


def test_create_get_list_and_the_queue_limit(store: JobStore) -> None:
    rows = [store.create(JobSpec(**TINY), owner="a", max_queued=2) for _ in range(2)]
    with pytest.raises(TooManyQueued):
        store.create(JobSpec(**TINY), owner="a", max_queued=2)
    store.create(JobSpec(**TINY), owner="b", max_queued=2)  # the limit is per owner
    listed, total = store.list(status="queued", limit=10)
    assert total == 3 and {r.id for r in rows} <= {r.id for r in listed}
    stored = store.get(rows[0].id)
    assert (
        stored.trials == 3 and "trials" not in stored.spec and "n_trials" not in stored.spec
    )  # the column is its one place
    assert JobSpec.of(stored) == JobSpec(**TINY)
    with pytest.raises(JobNotFound):
        store.get("nope")
    assert store.counts_by_status()["queued"] == 3


def test_cancel_a_queued_job_now_and_a_finished_one_never(store: JobStore) -> None:
    job = store.create(JobSpec(**TINY), owner="me")
    assert store.cancel(job.id).status == "cancelled"
    with pytest.raises(JobConflict, match="already cancelled"):
        store.cancel(job.id)


def test_a_running_job_is_flagged_and_its_heartbeat_reads_the_flag(store: JobStore) -> None:
    register(store, "w")
    job = store.create(JobSpec(**TINY), owner="me")
    assert store.claim("w", devices=("cpu",)) is not None
    assert store.cancel(job.id).cancel_requested
    lease = store.heartbeat(job.id, "w", phase="trial 1")
    assert lease.owned and lease.cancel_requested
    assert not store.heartbeat(job.id, "other").owned  # not a member


def test_a_job_flagged_for_cancel_never_ends_succeeded(store: JobStore) -> None:
    """The worker decided `succeeded`, and a cancel came between its last read of the flag and
    its finish: the finish reads the flag in the same statement (the review of 2026-12-07)."""
    register(store, "w")
    job = store.create(JobSpec(**TINY), owner="me")
    assert store.claim("w", devices=("cpu",)) is not None
    store.cancel(job.id)
    assert store.finish(job.id, "w", "succeeded", recommendation={"config": {"num_streams": 1}})
    row = store.get(job.id)
    assert (row.status, row.cancel_requested) == ("cancelled", True)
    assert row.recommendation is not None  # what the final round decided stays
    failed = store.create(JobSpec(**TINY), owner="me")
    assert store.claim("w", devices=("cpu",)) is not None
    store.cancel(failed.id)
    assert store.finish(failed.id, "w", "failed", error="it broke")
    assert store.get(failed.id).status == "failed"  # a failure is said as it was


def test_the_slot_lock_is_exclusive_until_given_back(store: JobStore) -> None:
    register(store, "a", "b")
    job = store.create(JobSpec(**TINY), owner="me")
    store.claim("a", devices=("cpu",))
    assert store.lock_slots(job.id, "a", hold_s=60)
    assert not store.lock_slots(job.id, "b", hold_s=60)
    assert store.unlock_slots(job.id, "a")
    assert store.lock_slots(job.id, "b", hold_s=60)
    assert not store.unlock_slots(job.id, "a")  # a's lock is gone


def test_one_finalizer_and_only_it_ends_the_job(store: JobStore) -> None:
    register(store, "a", "b")
    job = store.create(JobSpec(**TINY), owner="me")
    store.claim("a", devices=("cpu",))
    assert store.open_trials(job.id, "a", hardware="cpu", deadline=None)
    assert store.join(job.id, "b")
    assert store.claim_finalizing(job.id, "b")
    assert not store.claim_finalizing(job.id, "a")
    assert not store.finish(job.id, "a", "succeeded")
    assert store.finish(
        job.id,
        "b",
        "succeeded",
        recommendation={
            "study": job.study,
            "config": {"num_streams": 1},
            "hardware": "cpu",
            "throughput": {"median": 5.0, "ci95": [4.0, 6.0]},
        },
    )
    row = store.get(job.id)
    assert (row.status, row.rec_throughput, row.finalizer) == ("succeeded", 5.0, None)


def test_progress_stores_the_counting_rules_figures(store: JobStore) -> None:
    register(store, "w")
    job = store.create(JobSpec(**TINY), owner="me")
    store.claim("w", devices=("cpu",))
    counts = TrialCounts(complete=2, failed=1, pruned=1, interrupted=3, running=1)
    assert store.progress(job.id, "w", counts=counts, best=None)
    row = store.get(job.id)
    assert (row.n_complete, row.n_failed, row.n_pruned, row.n_interrupted) == (2, 1, 1, 3)
    # The worker's phase goes with the counts, in the same write (a worker's `trial_done`);
    # without one, the phase the heartbeat wrote stays.
    store.heartbeat(job.id, "w", phase="trial 4 running")
    more = dataclasses.replace(counts, complete=3)
    assert store.progress(job.id, "w", counts=more, best=None, phase="4 trials run here")
    assert (store.get(job.id).n_complete, store.get(job.id).phase) == (3, "4 trials run here")
    assert store.progress(job.id, "w", counts=more, best=None)
    assert store.get(job.id).phase == "4 trials run here"


def test_stale_jobs_go_back_to_the_queue_and_dead_workers_are_forgotten(store: JobStore) -> None:
    register(store, "w")
    job = store.create(JobSpec(**TINY), owner="me")
    store.claim("w", devices=("cpu",))
    with store.engine.begin() as conn:  # the worker's last heartbeat, an hour ago
        conn.execute(
            sa.text("UPDATE streamtune_jobs SET heartbeat_at = :t"),
            {"t": store.get(job.id).heartbeat_at.replace(year=2000)},
        )
        conn.execute(
            sa.update(WorkerRow).values(
                heartbeat_at=store.get(job.id).heartbeat_at.replace(year=2000)
            )
        )
    assert store.requeue_stale(lease_s=60, max_attempts=3) == 1
    assert store.get(job.id).status == "queued"
    assert [w.id for w in store.forget_dead_workers(60)] == ["w"]
    assert store.live_workers(60) == set()


def test_clean_hand_backs_are_not_attempts_and_a_lost_worker_after_them_is_requeued(
    store: JobStore,
) -> None:
    # Two clean restarts had counted as two lost workers: the first crash then failed the job.
    register(store, "w")
    job = store.create(JobSpec(**TINY), owner="me")
    for _ in range(2):  # claimed, then handed back at a shutdown
        assert store.claim("w", devices=("cpu",)) is not None
        assert store.requeue(job.id, "w", reason="its worker shut down", lease_s=60)
        assert (store.get(job.id).status, store.get(job.id).attempts) == ("queued", 0)
    store.claim("w", devices=("cpu",))
    assert store.get(job.id).attempts == 1
    with store.engine.begin() as conn:  # then lost: its heartbeat an hour old
        conn.execute(
            sa.text("UPDATE streamtune_jobs SET heartbeat_at = :t"),
            {"t": store.get(job.id).heartbeat_at.replace(year=2000)},
        )
    assert store.requeue_stale(lease_s=60, max_attempts=3) == 1
    assert store.get(job.id).status == "queued"  # one loss of three allowed, not the third


def test_a_finished_trial_is_recorded_once(store: JobStore) -> None:
    job = store.create(JobSpec(**TINY), owner="me")
    store.record_trial(job.id, 0, "complete", 1.5)
    store.record_trial(job.id, 0, "complete", 1.5)
    assert store.recorded_trials(job.id) == {0}
    assert store.trial_stats([1.0, 2.0]).by_state["complete"] == 1


def test_a_job_stored_with_n_trials_in_its_spec_too_reads_back(store: JobStore) -> None:
    """Rows written before `n_trials` had one place carry it in the spec JSON as well."""
    job = store.create(JobSpec(**TINY), owner="me")
    old = JobSpec(**TINY).to_stored() | {"n_trials": 3}  # its name then
    with store.engine.begin() as conn:
        conn.execute(sa.update(JobRow).where(JobRow.id == job.id).values(spec=old))
    assert JobSpec.of(store.get(job.id)) == JobSpec(**TINY)
    assert JobSpec.of(store.get(job.id)).trials == store.get(job.id).trials == 3


def test_a_job_of_gpus_n_takes_n_members_and_a_worker_of_one_job_no_other(
    store: JobStore,
) -> None:
    register(store, "a", "b", "c")
    other = store.create(JobSpec(**TINY), owner="me")
    job = store.create(JobSpec(**(TINY | {"gpus": 2})), owner="me")
    # A worker started for `job` (`worker --job`) passes the older job by.
    claimed = store.claim("a", devices=("cpu",), job=job.id)
    assert claimed is not None and claimed.id == job.id
    assert store.open_trials(job.id, "a", hardware="cpu", deadline=None)
    assert [r.id for r in store.joinable(devices=("cpu",), hardware="cpu", job=job.id)] == [job.id]
    limit = JobSpec.of(store.get(job.id)).max_members
    assert limit == 2
    assert store.join(job.id, "b", max_members=limit)
    assert not store.join(job.id, "c", max_members=limit)  # two members already
    assert store.join(job.id, "c")  # no limit: every free worker, as "all" means
    assert store.get(other.id).status == "queued"
    assert JobSpec(**TINY).max_members is None


def test_a_dedicated_job_is_claimed_and_joined_by_its_own_workers_only(store: JobStore) -> None:
    # `run --gpus N` on a database the service shares: a service worker, measuring with its own
    # settings, must not take the node job or join its study.
    register(store, "service", "node-a", "node-b")
    job = store.create(JobSpec(**(TINY | {"gpus": 2})), owner="cli", dedicated=True)
    shared = store.create(JobSpec(**TINY), owner="me")
    claimed = store.claim("service", devices=("cpu",))
    assert claimed is not None and claimed.id == shared.id  # the older, dedicated job passed by
    assert store.claim("node-a", devices=("cpu",), job=job.id) is not None
    assert store.open_trials(job.id, "node-a", hardware="cpu", deadline=None)
    assert store.open_trials(shared.id, "service", hardware="cpu", deadline=None)
    seen = [r.id for r in store.joinable(devices=("cpu",), hardware="cpu")]
    assert seen == [shared.id]
    own = store.joinable(devices=("cpu",), hardware="cpu", job=job.id)
    assert [r.id for r in own] == [job.id]
    assert store.get(job.id).dedicated and not store.get(shared.id).dedicated


@pytest.mark.parametrize("gpus", [0, -1, True, "some", 1.5])
def test_check_spec_refuses_a_bad_gpus_naming_it(gpus: object) -> None:
    with pytest.raises(SpecError) as caught:
        check_spec(JobSpec(**(TINY | {"gpus": gpus})), WorkloadRegistry())
    assert caught.value.loc == ("gpus",) and "allowed 'all' or a whole number" in str(caught.value)
    check_spec(JobSpec(**(TINY | {"gpus": 3})), WorkloadRegistry())  # and takes a good one


def test_a_job_on_one_gpu_is_claimed_only_by_that_gpus_worker(store: JobStore) -> None:
    """`device: cuda:1` (the CLI's syntax) routes the job to the worker of GPU 1: a GPU worker
    offers `cuda` and its own `cuda:N` (`Worker.devices`), a CPU worker neither."""
    job = store.create(JobSpec(**(TINY | {"device": "cuda:1"})), owner="me")
    register(store, "cpu-worker", "gpu0", "gpu1")
    assert store.claim("cpu-worker", devices=("auto", "cpu")) is None
    assert store.claim("gpu0", devices=("auto", "cpu", "cuda", "cuda:0")) is None
    claimed = store.claim("gpu1", devices=("auto", "cpu", "cuda", "cuda:1"))
    assert claimed is not None and (claimed.id, claimed.device) == (job.id, "cuda:1")


def test_the_best_recommendation_is_of_the_asked_models_shape(store: JobStore) -> None:
    """A job of batch 32 answered for one of batch 4 (its throughput not comparable): the
    recommendations are matched by the model's effective options, however they were spelled."""

    def finished(model_args: dict[str, str], throughput: float) -> str:
        spec = JobSpec(workload="hf:causal-lm", preset="tiny", device="cpu", model_args=model_args)
        return _succeeded(store, spec, throughput, {})

    small = finished({"batch": "4"}, 495.0)
    large = finished({"batch": "32", "data": "fixed"}, 2427.0)
    default = finished({}, 800.0)
    as_preset = finished({"batch": "2"}, 900.0)  # tiny's own batch: the preset's shape
    best = store.best_for
    assert best("hf:causal-lm", "tiny", "cpu", model_args={"batch": "4"}).id == small
    assert best("hf:causal-lm", "tiny", "cpu", model_args={"data": "fixed", "batch": "32"}).id == (
        large
    )
    assert best("hf:causal-lm", "tiny", "cpu").id == as_preset  # the fastest of the preset's shape
    assert default != as_preset
    assert best("hf:causal-lm", "tiny", "cpu", model_args={"batch": "8"}) is None
    with pytest.raises(trainers.WorkloadError, match="model_arg 'batchh' is unknown"):
        best("hf:causal-lm", "tiny", "cpu", model_args={"batchh": "8"})


def test_the_best_recommendation_may_be_asked_for_one_precision(store: JobStore) -> None:
    """A float8 pick outran every bf16 one; a user who trains in bf16 asks for that."""

    def finished(precision: str, throughput: float) -> str:
        spec = JobSpec(workload="mlp", preset="tiny", device="cpu")
        return _succeeded(store, spec, throughput, {"precision": precision})

    bf16 = finished("bf16-autocast", 500.0)
    float8 = finished("float8", 900.0)
    finished("fp32", 1000.0)  # no precision named: stored as the matmul precision's (fp32)
    assert store.best_for("mlp", "tiny", "cpu", precision="bf16-autocast").id == bf16
    assert store.best_for("mlp", "tiny", "cpu", precision="float8").id == float8
    assert store.best_for("mlp", "tiny", "cpu", precision="fp16-autocast") is None
    assert store.best_for("mlp", "tiny", "cpu").rec_throughput == 1000.0


def _succeeded(store: JobStore, spec: JobSpec, throughput: float, extra: dict[str, Any]) -> str:
    """A job of `spec` recorded as succeeded on the CPU at `throughput`, its recommendation
    holding `extra`; its id."""
    job = store.create(spec, owner="me")
    with store.engine.begin() as conn:
        conn.execute(
            sa.update(JobRow)
            .where(JobRow.id == job.id)
            .values(
                status="succeeded",
                hardware="cpu",
                rec_throughput=throughput,
                recommendation={"config": {}, "study": job.study, **extra},
            )
        )
    return job.id
