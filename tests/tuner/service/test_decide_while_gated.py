"""A job's finalizer and its helpers on one study (`tuner.search.search.Search.decide`,
`tuner.search.helping`): real job rows and claims (`tuner.service.gatehelp.JobClaims`) in SQLite
and PostgreSQL, a real screening search of the tiny workload on the CPU; the other worker is a
thread holding its claims as another process would."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import pg_listening
from tests.tuner.tiny import options
from trainers import LoopConfig
from trainers.gate.verdict import ParityVerdict
from tuner.search import helping
from tuner.search.gating.verdict import GateVerdict
from tuner.search.options import LocalSlots, Quiet
from tuner.search.search import Search
from tuner.search.study import open_search
from tuner.service.gatehelp import JobClaims
from tuner.service.jobstore import JobStore
from tuner.service.spec import JobSpec
from tuner.service.tables import JobRow
from tuner.store import keys
from tuner.store.retry import Backoff

TINY = {"workload": "mlp", "preset": "tiny", "trials": 4, "device": "cpu"}


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/jobs.db"
    if not pg_listening():
        pytest.skip("PostgreSQL is not reachable on 127.0.0.1:5432")
    return str(request.getfixturevalue("pg_url"))


class _Phases(Quiet):
    def __init__(self) -> None:
        self.seen: list[tuple[float, str]] = []

    def phase(self, text: str) -> None:
        self.seen.append((time.monotonic(), text))

    def first(self, prefix: str) -> float | None:
        return next((at for at, text in self.seen if text.startswith(prefix)), None)


def _claims(store: JobStore, job: str, search: Search, worker: str) -> JobClaims:
    claims = JobClaims(
        store,
        search.study,
        job_id=job,
        worker=worker,
        alive=lambda: store.live_workers(60.0),
        hold_s=30.0,
        backoff=Backoff(base_s=0.01, max_s=0.1),
    )
    claims.wait_s = 0.05
    return claims


def _open_job(url: str, claimer: str, *others: str) -> tuple[JobStore, JobRow]:
    """A job opened for trials by `claimer`, which `others` have joined (every one a live
    worker row)."""
    store = JobStore(url)
    for name in (claimer, *others):
        store.register_worker(name, host="h", pid=1, device="cpu")
    job = store.create(JobSpec(**TINY), owner="me")
    store.claim(claimer, devices=("cpu",))
    assert store.open_trials(job.id, claimer, hardware="cpu", deadline=None)
    for name in others:
        assert store.join(job.id, name, max_members=None)
    return store, job


@pytest.fixture
def searched(url: str) -> Iterator[tuple[JobStore, str, Search, _Phases]]:
    """A job of two workers ("finalizer", "helper") whose finalizer ran every trial of a
    screening search (so no trial is gated yet), sharing the gate through the job's claims."""
    store, job = _open_job(url, "finalizer", "helper")
    phases = _Phases()
    opts = options(url, job.study, trials=4, screen="on", sampler="tpe", seed=3)
    search = open_search(opts, progress=phases)
    search.share_gate(_claims(store, job.id, search, "finalizer"))
    try:
        search.run_trials(LocalSlots(4))
        yield store, job.id, search, phases
    finally:
        search.close()


def _planted(passed: bool) -> dict[str, object]:
    return GateVerdict(
        verdict=ParityVerdict(
            passed=passed,
            exact_required=False,
            tolerance=0.0,
            steps=4,
            max_abs_deviation=0.0 if passed else 1.0,
            max_rel_deviation=0.0 if passed else 1.0,
            first_diverging_step=None if passed else 0,
            reason="planted by the test",
        )
    ).to_dict()


@pytest.mark.parametrize("passes", [True, False])
def test_the_final_round_measures_while_another_worker_gates_the_leader(
    searched: tuple[JobStore, str, Search, _Phases], passes: bool
) -> None:
    store, job, search, phases = searched
    leader = search.leader()
    assert leader is not None and leader[1] not in search.study.user_attrs  # not gated yet
    number, key = leader
    other = _claims(store, job, search, "helper")
    assert other.take(key)  # the helper is gating the leader
    stored: list[float] = []

    def helper() -> None:
        # The verdict comes once the finalizer has measured (or after 30 s: a finalizer that
        # waits for it first fails the assertion below instead of hanging).
        deadline = time.monotonic() + 30
        while phases.first("final round 1/") is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)
        stored.append(time.monotonic())
        search.study.set_user_attr(key, _planted(passes))
        other.release(key)

    thread = threading.Thread(target=helper)
    thread.start()
    recommendation = search.decide()
    thread.join()
    measured = phases.first("final round 1/")
    assert measured is not None and measured < stored[0]  # measured before the verdict came
    again = phases.first("final round again")
    leading = search.study.trials[number].user_attrs[keys.CONFIG]
    if passes:
        assert again is None
        assert search.study.user_attrs[key]["reason"] == "planted by the test"  # not re-run
    else:
        # The leader failed: the final round ran again on what leads now, and the failed
        # config is not the answer.
        assert again is not None and again > stored[0]
        assert search.leader() != leader
        assert recommendation.config != leading


def test_a_helper_profiles_the_baselines_while_trials_run_and_the_leader_before_its_verdict(
    url: str, tmp_path: Path
) -> None:
    store, job = _open_job(url, "helper")
    opts = options(url, job.study, trials=3, screen="on", profile="baselines")
    search = open_search(opts)
    try:
        search.share_gate(_claims(store, job.id, search, "helper"))
        search.run_trials(LocalSlots(3))
        shared = search.shared_profiles
        assert shared is not None and search.profiler is not None
        # While trials still run: the baselines, and not the leader (it may change).
        ahead = []
        tried: set[str] = set()
        while (found := helping.next_to_profile(search, tried, leader=False)) is not None:
            tried.add(found[0])
            ahead.append(found[1])
        assert ahead == list(search.baseline_configs.values())
        # Once none runs: the leader too, before any baseline, its verdict not known yet.
        leader = search.leader()
        assert leader is not None and leader[1] not in search.study.user_attrs
        first = helping.next_to_profile(search, set(), leader=True)
        config = LoopConfig.from_dict(search.study.trials[leader[0]].user_attrs[keys.CONFIG])
        assert first is not None and first[1] == config
        found = helping.next_to_profile(search, tried, leader=True)
        assert found is not None and found[1] == config
        # A leader whose gate failed is not profiled: the next one is.
        search.study.set_user_attr(leader[1], _planted(False))
        after = helping.next_to_profile(search, tried, leader=True)
        assert after is None or after[1] != config
    finally:
        search.close()


def test_once_no_trial_runs_a_helper_profiles_before_it_gates_a_config_behind_the_leader(
    url: str,
) -> None:
    """The gate of a config behind the leader counts only if the leader's gate fails; the
    profiles always: once settled, a helper whose leader another worker is gating takes the
    profiles first (`helping.help_job`)."""
    store, job = _open_job(url, "helper", "finalizer")
    phases = _Phases()
    opts = options(
        url, job.study, trials=4, screen="on", profile="baselines", tie_margin=0.9, seed=3
    )
    search = open_search(opts, progress=phases)
    try:
        search.share_gate(_claims(store, job.id, search, "helper"))
        search.run_trials(LocalSlots(4))
        leader = search.leader()
        assert leader is not None
        # The finalizer is gating the leader; another config is within the final round's reach.
        assert _claims(store, job.id, search, "finalizer").take(leader[1])
        behind = helping.next_to_gate(search, set())
        assert behind is not None and behind[3] != leader[0]
        helping.help_job(search, lambda: False, lambda: True, wait=False)
        texts = [text for _, text in phases.seen]
        profiled = [i for i, t in enumerate(texts) if t.startswith("profile: ahead")]
        gated = [i for i, t in enumerate(texts) if t.startswith("gate: trial")]
        assert profiled and gated and max(profiled) < min(gated), texts
        assert f"gate: trial {behind[3]}'s config" in texts[min(gated)]
        # The finalizer's to run; its own run, at most, is left to a helper (the next test).
        assert f"gate: trial {leader[0]}'s config" not in " ".join(texts)
    finally:
        search.close()


def test_a_helper_runs_the_config_another_worker_gates_while_that_one_runs_its_twin(
    url: str,
) -> None:
    """`helping.next_config_run`: of the configs another worker is gating, one owed an eager
    twin has its own run left to a helper (taken first, and stored for that check); a config
    whose check is its own run, or that nobody gates now, is not."""
    store, job = _open_job(url, "helper", "checker")
    phases = _Phases()
    fixed = ("optimizer=foreach",)  # arithmetic changed: each config with loop settings owes a twin
    opts = options(url, job.study, trials=6, screen="on", tie_margin=0.9, seed=3, fix=fixed)
    search = open_search(opts, progress=phases)
    try:
        search.share_gate(_claims(store, job.id, search, "helper"))
        search.run_trials(LocalSlots(6))
        cache = search.parity_cache
        reach = helping._within_reach(search, search.study.get_trials(deepcopy=False))
        owed = [
            (t.number, LoopConfig.from_dict(t.user_attrs[keys.CONFIG]))
            for t in reach
            if cache.owes_twin(LoopConfig.from_dict(t.user_attrs[keys.CONFIG]))
        ]
        assert owed, [t.user_attrs[keys.CONFIG] for t in reach]
        number, config = owed[-1]
        assert helping.next_config_run(search, set()) is None  # nobody gates anything yet
        checker = _claims(store, job.id, search, "checker")
        for trial in reach:  # the checker holds every gate in reach
            assert checker.take(cache.key(LoopConfig.from_dict(trial.user_attrs[keys.CONFIG])))
        found = helping.next_config_run(search, {cache.run_key(c) for _, c in owed[:-1]})
        assert found is not None and found[1:] == (config, None, number)
        leader = search.leader()
        assert leader is not None
        # Settled (no trial runs): the leader's own run alone, after the envelope each check
        # needs; another's counts only if the leader's gate fails.
        helping.help_job(search, lambda: False, lambda: True, wait=False)
        texts = [text for _, text in phases.seen]
        gated = [t for t in texts if t.startswith("gate:")]  # other lines: a cache loaded, ...
        assert gated[0].startswith("gate: the envelope"), texts
        ran = [t for t in texts if t.startswith("gate: trial")]
        leading = leader[0] in [n for n, _ in owed]
        assert ran == (
            [f"gate: trial {leader[0]}'s own run, while another worker runs its twin"]
            if leading
            else []
        ), texts
        # While trials run: every other one, none of the gates the checker holds.
        helping.help_job(search, lambda: False, lambda: False, wait=False)
        texts = [text for _, text in phases.seen]
        ran = sorted(int(t.split()[2].split("'")[0]) for t in texts if t.startswith("gate: trial"))
        assert ran == sorted(n for n, _ in owed), texts
        assert all("own run" in t for t in texts if t.startswith("gate: trial"))
        stored = search.study.user_attrs
        assert all(cache.run_key(c) in stored for _, c in owed)
        assert helping.next_config_run(search, set()) is None  # each is stored now
    finally:
        search.close()


def test_a_run_that_fails_on_the_helper_is_left_to_the_check_that_holds_the_gate(
    url: str,
) -> None:
    """A helper whose run of another worker's config fails (its child out of memory) says so
    and goes on; the claim is given back, so that worker's check runs the config itself."""
    store, job = _open_job(url, "helper", "checker")
    phases = _Phases()
    fixed = ("optimizer=foreach",)
    opts = options(url, job.study, trials=4, screen="on", tie_margin=0.9, seed=3, fix=fixed)
    search = open_search(opts, progress=phases)
    try:
        search.share_gate(_claims(store, job.id, search, "helper"))
        search.run_trials(LocalSlots(4))
        cache = search.parity_cache
        checker = _claims(store, job.id, search, "checker")
        for trial in helping._within_reach(search, search.study.get_trials(deepcopy=False)):
            checker.take(cache.key(LoopConfig.from_dict(trial.user_attrs[keys.CONFIG])))
        found = helping.next_config_run(search, set())
        assert found is not None

        def out_of_memory(config: LoopConfig, *, precision: str | None = None) -> None:
            raise RuntimeError("CUDA out of memory (the helper's child)")

        cache.gate.config_run = out_of_memory  # type: ignore[method-assign,assignment]
        helping.help_job(search, lambda: False, lambda: False, wait=False)
        texts = [text for _, text in phases.seen]
        assert any("not taken here: CUDA out of memory" in t for t in texts), texts
        assert cache.run_key(found[1]) not in search.study.user_attrs
        assert checker.holder(cache.run_key(found[1])) is None  # given back: free to take
        assert checker.take(cache.run_key(found[1]))
    finally:
        search.close()
