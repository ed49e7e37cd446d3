"""The gate's work shared among one job's workers (`tuner.service.gatehelp`): real job rows and
a real Optuna study in SQLite (and PostgreSQL), the built-in gate on the tiny workload, two
workers' `ParityCache`s in two threads as two processes would hold them."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import optuna
import pytest

import trainers
from tests.conftest import pg_listening
from trainers import LoopConfig
from tuner.search.gating.gate import ConfigRun, GateRun, InProcessGate
from tuner.search.gating.parity import ParityCache
from tuner.search.measuring.timing import Clock
from tuner.search.options import NoRetry
from tuner.service.gatehelp import CLAIM_PREFIX, JobClaims
from tuner.service.jobstore import JobStore
from tuner.service.slots import JobSlots
from tuner.service.spec import JobSpec
from tuner.store import keys
from tuner.store import storage as studies
from tuner.store.jsonsafe import json_safe
from tuner.store.retry import Backoff

TINY = {"workload": "mlp", "preset": "tiny", "trials": 3, "device": "cpu"}
ARGS = trainers.RunArgs(steps=4, seed=0, device="cpu")


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/jobs.db"
    if not pg_listening():
        pytest.skip("PostgreSQL is not reachable on 127.0.0.1:5432")
    return str(request.getfixturevalue("pg_url"))


class _CountingGate(InProcessGate):
    """The built-in gate, counting its runs and slowed so that another worker asks meanwhile."""

    def __init__(self, pause_s: float = 0.0, args: trainers.RunArgs = ARGS) -> None:
        super().__init__("mlp", "tiny", args)
        self.checks: list[dict[str, Any]] = []
        self.envelopes = 0
        self.envelope_precisions: list[str | None] = []
        self.pause_s = pause_s
        self.given: list[Any] = []
        self.config_runs = 0

    def check(self, config: LoopConfig, envelope: Any, **more: Any) -> GateRun:
        self.checks.append({"envelope_given": envelope is not None, **more})
        run = more.get("run")
        if run is not None:  # what the config's own run, asked for after the twin, gave

            def recorded() -> Any:
                self.given.append(run())
                return self.given[-1]

            more["run"] = recorded
        time.sleep(self.pause_s)
        return super().check(config, envelope, **more)

    def config_run(self, config: LoopConfig, *, precision: str | None = None) -> ConfigRun:
        self.config_runs += 1
        return super().config_run(config, precision=precision)

    def envelope(self, *, precision: str | None = None) -> GateRun:
        self.envelopes += 1
        self.envelope_precisions.append(precision)
        time.sleep(self.pause_s)
        return super().envelope(precision=precision)


def _job(url: str, *names: str) -> tuple[JobStore, str, optuna.Study]:
    store = JobStore(url)
    for name in names:
        store.register_worker(name, host="h", pid=1, device="cpu")
    job = store.create(JobSpec(**TINY), owner="me")
    store.claim(names[0], devices=("cpu",))
    assert store.open_trials(job.id, names[0], hardware="cpu", deadline=None)
    for name in names[1:]:
        assert store.join(job.id, name, max_members=None)
    study = optuna.create_study(study_name=job.study, storage=studies.open_storage(url))
    return store, job.id, study


def claims_of(store: JobStore, job: str, study: optuna.Study, worker: str) -> JobClaims:
    """`worker`'s claims on `job`'s study, waiting 0.05 s between reads."""
    claims = JobClaims(
        store,
        study,
        job_id=job,
        worker=worker,
        alive=lambda: store.live_workers(60.0),
        hold_s=5.0,
        backoff=Backoff(base_s=0.01, max_s=0.1),
    )
    claims.wait_s = 0.05
    return claims


def _cache(store: JobStore, job: str, study: optuna.Study, worker: str, gate: Any) -> ParityCache:
    claims = claims_of(store, job, study, worker)
    return ParityCache(study, gate, retry=NoRetry(), clock=Clock(), claims=claims)


def test_a_config_being_checked_by_another_worker_is_waited_for_not_checked_twice(
    url: str,
) -> None:
    store, job, study = _job(url, "a", "b")
    slow, idle = _CountingGate(pause_s=1.0), _CountingGate()
    first, second = _cache(store, job, study, "a", slow), _cache(store, job, study, "b", idle)
    config = LoopConfig(num_streams=2)
    found: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: found.update(a=first.check(config)))
    thread.start()
    deadline = time.monotonic() + 30
    while not study.user_attrs.get(CLAIM_PREFIX + first.key(config)):
        assert time.monotonic() < deadline, "worker a never claimed the config"
        time.sleep(0.01)
    verdict, spent = second.check(config)  # b asks while a checks
    thread.join()
    assert idle.checks == [] and spent == {}  # b ran nothing: it read a's verdict
    assert len(slow.checks) == 1 and verdict == found["a"][0] and verdict.passed
    assert study.user_attrs[CLAIM_PREFIX + first.key(config)] == ""  # given back


def test_a_configs_own_run_taken_by_an_idle_worker_is_judged_by_the_checking_one(
    url: str,
) -> None:
    """The check's two runs on two workers: while one runs the config's eager twin, another
    runs the config itself (`run_config`) and stores its losses bit for bit; the check judges
    those, and its verdict is the one a check running both gives."""
    store, job, study = _job(url, "a", "b")
    config = LoopConfig(num_streams=2, optimizer="foreach")  # owed its twin's bits and equivalence
    checking, idle = _CountingGate(pause_s=1.0), _CountingGate()
    first, second = _cache(store, job, study, "a", checking), _cache(store, job, study, "b", idle)
    assert first.measure_envelope() and first.owes_twin(config)
    assert not first.owes_twin(LoopConfig(num_streams=2))  # its own run is its whole check
    found: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: found.update(a=first.check(config)))
    thread.start()
    deadline = time.monotonic() + 30
    while not study.user_attrs.get(CLAIM_PREFIX + first.key(config)):
        assert time.monotonic() < deadline, "worker a never claimed the config"
        time.sleep(0.01)
    assert second.run_config(
        config
    )  # b runs the config while a runs (here: pauses before) its twin
    thread.join()
    verdict, spent = found["a"]
    stored = study.user_attrs[second.run_key(config)]
    losses = [float.fromhex(x) for x in stored["losses"]]
    assert idle.config_runs == 1 and checking.config_runs == 0 and checking.given == [losses]
    assert "gate_twin" in spent and stored["time"]["gate_config"] > 0
    assert not second.run_config(config)  # judged now: nothing is left to run
    assert study.user_attrs[CLAIM_PREFIX + second.run_key(config)] == ""  # given back
    alone = _CountingGate().check(config, study.user_attrs[keys.ENVELOPE])
    assert verdict.verdict == alone.verdict and verdict.passed


def test_a_check_with_nobody_to_take_its_own_run_runs_it_and_holds_it_meanwhile(
    url: str,
) -> None:
    store, job, study = _job(url, "a", "b")
    config = LoopConfig(num_streams=2, optimizer="foreach")
    checking = _CountingGate()
    first = _cache(store, job, study, "a", checking)
    first.measure_envelope()
    second = _cache(store, job, study, "b", _CountingGate())
    study.set_user_attr(CLAIM_PREFIX + second.run_key(config), "b")  # b took the run, then died
    store.remove_worker("b")
    verdict, _ = first.check(config)
    assert verdict.passed and checking.given == [None]  # asked, nobody had it: ran in the check
    assert second.run_key(config) not in study.user_attrs
    assert study.user_attrs[CLAIM_PREFIX + second.run_key(config)] == ""  # a's claim given back


def test_a_claim_whose_worker_died_is_taken_over(url: str) -> None:
    store, job, study = _job(url, "a", "b")
    config = LoopConfig(num_streams=2)
    mine = _cache(store, job, study, "b", _CountingGate())
    study.set_user_attr(CLAIM_PREFIX + mine.key(config), "a")  # a claimed it, then died
    store.remove_worker("a")
    verdict, spent = mine.check(config)
    assert verdict.passed and spent  # b checked it itself instead of waiting forever


def test_the_envelope_measured_by_a_helper_is_what_the_finalizers_twin_waits_for(
    url: str,
) -> None:
    store, job, study = _job(url, "helper", "finalizer")
    helping, deciding = _CountingGate(pause_s=1.0), _CountingGate()
    helper = _cache(store, job, study, "helper", helping)
    finalizer = _cache(store, job, study, "finalizer", deciding)
    thread = threading.Thread(target=helper.measure_envelope)
    thread.start()
    deadline = time.monotonic() + 30
    while not study.user_attrs.get(CLAIM_PREFIX + keys.ENVELOPE):
        assert time.monotonic() < deadline, "the helper never claimed the envelope"
        time.sleep(0.01)
    verdict, spent = finalizer.check(LoopConfig(num_streams=2, optimizer="foreach"))
    thread.join()
    assert helping.envelopes == 1 and deciding.envelopes == 0
    # The finalizer ran its twin and its config, and waited for the helper's envelope.
    assert [("pending" in c, c["envelope_given"]) for c in deciding.checks] == [(True, False)]
    assert verdict.passed and "gate_reference" not in spent and "gate_twin" in spent
    assert study.user_attrs[keys.ENVELOPE] == helper._attrs()[keys.ENVELOPE]
    # Stored now: nobody measures it again, and a second helper finds nothing to do.
    assert not _cache(store, job, study, "helper", _CountingGate()).measure_envelope()


def test_an_envelope_a_check_is_measuring_is_not_measured_by_a_helper_too(url: str) -> None:
    store, job, study = _job(url, "finalizer", "helper")
    deciding, helping = _CountingGate(pause_s=1.0), _CountingGate()
    finalizer = _cache(store, job, study, "finalizer", deciding)
    helper = _cache(store, job, study, "helper", helping)
    thread = threading.Thread(target=lambda: finalizer.check(LoopConfig(num_streams=2)))
    thread.start()
    deadline = time.monotonic() + 30
    while study.user_attrs.get(CLAIM_PREFIX + keys.ENVELOPE) != "finalizer":
        assert time.monotonic() < deadline, "the finalizer's check never claimed the envelope"
        time.sleep(0.01)
    assert not helper.measure_envelope()  # the finalizer's check is measuring it
    thread.join()
    assert helping.envelopes == 0 and helping.checks == []
    assert isinstance(study.user_attrs[keys.ENVELOPE], dict)
    assert study.user_attrs[CLAIM_PREFIX + keys.ENVELOPE] == ""


def test_a_helper_measures_the_envelope_a_config_in_another_precision_is_judged_by(
    url: str,
) -> None:
    """A config in another precision than the study's is judged against the reference's
    seed-to-seed envelope: the helper measures that one (not the study's rounding one), and the
    finalizer's check of such a config runs its twin, then waits for it."""
    store, job, study = _job(url, "helper", "finalizer")
    fp32 = ARGS.replace(precision="fp32")  # the study's precision, named (`RunOptions.precisions`)
    helping, deciding = _CountingGate(pause_s=1.0, args=fp32), _CountingGate(args=fp32)
    helper = _cache(store, job, study, "helper", helping)
    finalizer = _cache(store, job, study, "finalizer", deciding)
    assert helper.envelope_key("bf16-autocast") == keys.PRECISION_ENVELOPE
    thread = threading.Thread(target=lambda: helper.measure_envelope("bf16-autocast"))
    thread.start()
    deadline = time.monotonic() + 30
    while not study.user_attrs.get(CLAIM_PREFIX + keys.PRECISION_ENVELOPE):
        assert time.monotonic() < deadline, "the helper never claimed the envelope"
        time.sleep(0.01)
    verdict, spent = finalizer.check(LoopConfig(num_streams=2), "bf16-autocast")
    thread.join()
    assert helping.envelope_precisions == ["bf16-autocast"] and deciding.envelopes == 0
    assert [("pending" in c, c["precision"]) for c in deciding.checks] == [(True, "bf16-autocast")]
    assert verdict.passed and "gate_reference" not in spent and "gate_twin" in spent
    stored = study.user_attrs[keys.PRECISION_ENVELOPE]
    assert stored["spread"] == "seeds" and keys.ENVELOPE not in study.user_attrs
    # The same envelope as a check that measures it itself stores (its steps and spread).
    alone = _CountingGate(args=fp32).check(
        LoopConfig(num_streams=2), None, precision="bf16-autocast"
    )
    assert json_safe(alone.envelope) == stored


def test_no_trial_slot_is_taken_once_a_worker_claimed_the_final_round(url: str) -> None:
    """The patience ends a job's trials with slots still free: a worker that found it short a
    moment before takes no slot once another claimed the final round (`JobSlots`), and the claim
    is made under the slot lock (`JobRun`), so the two cannot cross."""
    store, job, study = _job(url, "a", "b")
    storage = studies.open_storage(url)
    row = store.get(job)
    slots = JobSlots(
        store,
        storage,
        job=row,
        deadline=None,
        worker="b",
        hold_s=5.0,
        backoff=Backoff(base_s=0.01, max_s=0.1),
    )

    def take() -> optuna.Trial | None:
        return slots.take(study.ask, lambda trial: None)

    first = take()
    assert first is not None and slots.count().free == TINY["trials"] - 1
    study.tell(first, 1.0)
    assert slots.locked(lambda: store.claim_finalizing(job, "a"))
    assert slots.count().free > 0 and take() is None  # free slots, and none taken
    assert len(study.get_trials(deepcopy=False)) == 1


@pytest.mark.parametrize(("copied", "said"), [(3, "0 run, 3 taken"), (2, "1 run, 2 taken")])
def test_a_repeat_jobs_copied_trials_are_said_taken_not_run(
    url: str, copied: int, said: str
) -> None:
    """A job POSTed again began with the first one's trials, copied (`tuner.search.earlier`),
    and its `search_ended` said "every trial asked for was run or taken (3 run)" (a probe,
    2026-12-07): the copies are taken, not run."""
    store, job, study = _job(url, "a")
    for number in range(copied):
        copy = {keys.COPIED_FROM: {"study": "job-first", "trial": number}}
        study.add_trial(optuna.trial.create_trial(value=1.0, user_attrs=copy))
    for _ in range(TINY["trials"] - copied):
        study.tell(study.ask(), 2.0)
    slots = JobSlots(
        store,
        studies.open_storage(url),
        job=store.get(job),
        deadline=None,
        worker="a",
        hold_s=5.0,
        backoff=Backoff(base_s=0.01, max_s=0.1),
    )
    assert slots.take(study.ask, lambda trial: None) is None
    line = f"every trial asked for was run or taken ({said} from an earlier study)"
    assert slots.ended() == ("trials", line)
