"""What a job's worker with no trial left does while the others run theirs or decide.

With `run --gpus N`, the workers whose trials have ended used to sit idle while the finalizer ran
the gate and the profiles on its own GPU, one after another: on `llama-1b` with 4 H100s
(2026-11-28, `docs/benchmarks/node-h100-2026-11-28-llama-1b-partial.md`) 666 s of an 884 s job,
the winner's gate (twin, then its own run), the final round and the profiles in a row. Here such
a worker takes, on its own GPU, the parts that do not compare speeds:
1. the envelope (its reference included) that the configs to gate are judged against: the
   study's own, or for a config in another precision the reference's seed-to-seed one
   (`next_envelope`);
2. the own run of a config whose gate another worker holds while that worker runs the config's
   eager twin (`next_config_run`): the gate's two longest runs, on two GPUs at once. On 4 H200s
   (`llama-1b`, 2026-11-28, 370eb22) the leader's twin (137 s) and its own run (34 s) ran one
   after the other while two GPUs were idle;
3. the gate of each complete trial the final round can reach, fastest first (a screening study
   defers them), then of each trial still running, oldest first: a gate needs a config, not its
   speed, so the last trial's gate need not wait for it to end;
4. the profiles of the baselines, and once no trial runs any more, first of the leading config
   whose gate has not failed (most often the one recommended; its verdict may still be on its way),
   kept by config (`SharedProfiles`) for the finalizer to copy when it profiles after its final
   round. On 4 H100s (`llama-1b`, 2026-11-28, d1073e1) the leader's profile waited for its gate
   and ended about 100 s after the final round did.

Each part is claimed once among the workers (`tuner.search.gating.parity.GateClaims`); the
finalizer waits for a part another worker holds rather than run it again. Every comparison of
speeds (trials, the final round) stays on one GPU each: a gate compares losses, and a profile
says where one config's time goes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from optuna.trial import FrozenTrial, TrialState

from trainers import LoopConfig
from tuner.evidence.profiles import profile_attrs
from tuner.search.proposing.predict import TIME_SPARE
from tuner.search.proposing.screen import recommendable
from tuner.store import keys
from tuner.store.phases import PROFILE

if TYPE_CHECKING:
    from tuner.search.search import Search

POLL_S = 2.0
"""How often a helping worker looks again for a trial that has just started or ended."""


def help_job(
    search: Search, over: Callable[[], bool], settled: Callable[[], bool], *, wait: bool
) -> int:
    """The module doc's parts, in its order, until `over()` (the job ended, this worker stops,
    or a trial slot came free for it) or nothing is left to take: once `settled()` (no trial
    runs any more), or at once where `wait` is False (a service worker, which a queued job may
    need, takes what is there and goes). Once settled, the profiles go before the gate (or own
    run) of a config behind the leader: that verdict counts only if the leader's gate fails, the
    profiles always. Returns how many parts it took."""
    taken = 0
    tried: set[str] = set()
    while not over():
        done = settled()  # read first: a trial ending meanwhile is looked at next time
        envelope = next_envelope(search, tried)
        if envelope is not None:
            key, precision = envelope
            tried.add(key)
            judged = "the study's" if precision is None else f"{precision}'s"
            search.progress.phase(f"gate: the envelope {judged} configs are judged against")
            try:
                taken += int(search.parity_cache.measure_envelope(precision))
            except Exception as exc:  # noqa: BLE001 - the first check that needs it measures it
                search.progress.phase(f"gate: that envelope was not measured here: {exc}")
            continue
        run = next_config_run(search, tried)
        if run is not None and (not done or run[3] == _leader(search)):
            key, config, precision, number = run
            tried.add(key)
            search.progress.phase(
                f"gate: trial {number}'s own run, while another worker runs its twin"
            )
            try:
                taken += int(search.parity_cache.run_config(config, precision))
            except Exception as exc:  # noqa: BLE001 - the check that holds the gate runs it
                search.progress.phase(f"gate: that run was not taken here: {exc}")
            continue
        gate = next_to_gate(search, tried)
        profile = next_to_profile(search, tried, leader=done)
        if gate is not None and (profile is None or not done or gate[3] == _leader(search)):
            key, config, precision, number = gate
            tried.add(key)
            claims = search.parity_cache.claims
            if claims is not None and not claims.take(key):
                continue  # another worker took it meanwhile
            search.progress.phase(f"gate: trial {number}'s config, while the others run or decide")
            search.parity_cache.check(config, precision)
            taken += 1
            continue
        if profile is not None:
            tried.add(profile[0])
            taken += int(_profile(search, profile[1], profile[2]))
            continue
        if done or not wait:
            break
        time.sleep(POLL_S)
    return taken


def next_envelope(search: Search, tried: set[str]) -> tuple[str, str | None] | None:
    """The envelope to measure next, on its own, and the precision whose configs it judges: the
    one that the configs to gate (`next_to_gate`'s, whether or not another worker holds them)
    are judged against, the first of them first, where neither the study has it nor another
    worker measures it; with no config to gate yet, the study's own. A config in another
    precision than the study's is judged against another envelope than the study's
    (`ParityCache.envelope_key`): on 2 H200s (`llama-1b`, bf16 with float8 allowed,
    2026-11-28) the helper measured the study's for 144 s while every config in reach was in
    float8, and the finalizer then measured the float8 one itself before its gate could end.
    None: none is left."""
    cache = search.parity_cache
    trials = search.retry.call(lambda: search.study.get_trials(deepcopy=False), what="reading")
    candidates = [*_within_reach(search, trials), *_running(trials)]
    precisions = [t.user_attrs.get(keys.PRECISION) for t in candidates] or [None]
    attrs = search.retry.call(lambda: search.study.user_attrs, what="reading the study")
    for precision in precisions:
        key = cache.envelope_key(precision)
        busy = cache.claims is not None and cache.claims.holder(key) is not None
        if key not in tried and not isinstance(attrs.get(key), dict) and not busy:
            return key, precision
    return None


def _running(trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The trials running now whose config is known, oldest first."""
    return sorted(
        (t for t in trials if t.state == TrialState.RUNNING and keys.CONFIG in t.user_attrs),
        key=lambda t: t.number,
    )


def _leader(search: Search) -> int | None:
    """The number of the fastest trial that can still be recommended (None: none)."""
    trials = search.retry.call(lambda: search.study.get_trials(deepcopy=False), what="reading")
    ranked = recommendable(
        trials, failed=search.parity_cache.failed(), cap=search.options.max_memory_bytes
    )
    return ranked[0].number if ranked else None


def next_to_gate(search: Search, tried: set[str]) -> tuple[str, LoopConfig, str | None, int] | None:
    """The next config to gate: one whose verdict is not known, not run elsewhere now and not
    tried here; first within the final round's reach, then still running (module doc). None:
    none is left."""
    trials = search.retry.call(lambda: search.study.get_trials(deepcopy=False), what="reading")
    running = _running(trials)
    attrs = search.retry.call(lambda: search.study.user_attrs, what="reading the study")
    claims = search.parity_cache.claims
    for trial in [*_within_reach(search, trials), *running]:
        config = LoopConfig.from_dict(trial.user_attrs[keys.CONFIG])
        precision = trial.user_attrs.get(keys.PRECISION)
        key = search.parity_cache.key(config, precision)
        busy = claims is not None and claims.holder(key) is not None
        if key not in attrs and key not in tried and not busy:
            return key, config, precision, trial.number
    return None


def next_config_run(
    search: Search, tried: set[str]
) -> tuple[str, LoopConfig, str | None, int] | None:
    """The next config whose own gate run to take (the module doc's second part): its gate held
    by another worker now, owed an eager twin (so that worker has a run to leave), its verdict
    and its run neither stored nor taken elsewhere nor tried here; the configs in the order of
    `next_to_gate`. Returns the run's key, the config, its precision and its trial's number;
    None: none (or the gate runs a config's own run only within its check)."""
    cache = search.parity_cache
    claims = cache.claims
    if claims is None or not cache.gate.runs_apart:
        return None
    trials = search.retry.call(lambda: search.study.get_trials(deepcopy=False), what="reading")
    attrs = search.retry.call(lambda: search.study.user_attrs, what="reading the study")
    for trial in [*_within_reach(search, trials), *_running(trials)]:
        config = LoopConfig.from_dict(trial.user_attrs[keys.CONFIG])
        precision = trial.user_attrs.get(keys.PRECISION)
        gate_key, run_key = cache.key(config, precision), cache.run_key(config, precision)
        if gate_key in attrs or run_key in attrs or run_key in tried:
            continue
        if claims.holder(gate_key) is None or claims.holder(run_key) is not None:
            continue  # nobody gates it now (next_to_gate's), or its run is taken
        if cache.owes_twin(config, precision) and not cache.reuses_trial(config, precision):
            return run_key, config, precision, trial.number
    return None


def _within_reach(search: Search, trials: list[FrozenTrial]) -> list[FrozenTrial]:
    """The complete trials the final round can reach, one per config, fastest first: up to
    `top_k`, within the tie margin (and the screen's spare) of the fastest; none outside a
    screening study, where every complete trial was gated when it ran."""
    if not search.screening:
        return []
    options = search.options
    complete = recommendable(
        trials, failed=search.parity_cache.failed(), cap=options.max_memory_bytes
    )
    if not complete:
        return []
    reach = complete[0].values[0] * (1 - options.tie_margin - TIME_SPARE)
    found: dict[str, FrozenTrial] = {}
    for trial in complete:
        if trial.values[0] < reach or len(found) >= options.top_k:
            break
        found.setdefault(str(trial.user_attrs.get(keys.CONFIG_KEY)), trial)
    return list(found.values())


def next_to_profile(
    search: Search, tried: set[str], *, leader: bool
) -> tuple[str, LoopConfig, str | None] | None:
    """The next profile to take: with `leader` (no trial runs any more, so the leader is the
    final one) the leading config's first (the fastest config that can still be recommended: a
    config whose gate failed is left out, one whose verdict is not known yet is not), then a
    baseline's; each not stored, not being taken elsewhere and not tried here. None: none (or
    profiles are off, or not shared). The leader's goes first: it is the longest (169 s at
    `llama-1b`, 2026-11-28) and the last to become known, while the baselines' can be taken
    during the trials."""
    shared = search.shared_profiles
    if search.profiler is None or shared is None or shared.claims is None:
        return None
    targets: list[tuple[LoopConfig, str | None]] = [
        (config, None) for config in search.baseline_configs.values()
    ]
    trials = search.retry.call(lambda: search.study.get_trials(deepcopy=False), what="reading")
    ranked = recommendable(
        trials, failed=search.parity_cache.failed(), cap=search.options.max_memory_bytes
    )
    if leader and ranked:
        # Not waiting for its verdict: a profile compares no speeds and changes no decision,
        # and the GPU would be idle; if the gate fails it, the finalizer asks for another.
        config = LoopConfig.from_dict(ranked[0].user_attrs[keys.CONFIG])
        targets.insert(0, (config, ranked[0].user_attrs.get(keys.PRECISION)))
    for config, precision in targets:
        key = shared.key(config, precision)
        if key in tried or shared.get(config, precision) is not None:
            continue
        if shared.claims.holder(key) is None:
            return key, config, precision
    return None


def _profile(search: Search, config: LoopConfig, precision: str | None) -> bool:
    """Profile `config` here and keep it by config for the finalizer; whether it was taken (a
    failure is the finalizer's to meet again, and to record)."""
    shared, profiler = search.shared_profiles, search.profiler
    assert shared is not None and profiler is not None  # next_to_profile checked both
    if shared.claims is not None and shared.claims.holder(shared.key(config, precision)):
        return False  # another worker took it meanwhile
    search.progress.phase("profile: ahead of the decision, while the finalizer measures")
    with shared.claimed(config, precision):
        try:
            with search.clock.timing(PROFILE):
                found = (
                    profiler(config) if precision is None else profiler(config, precision=precision)
                )
                name = f"ahead-{shared.key(config, precision).rsplit('/', 2)[-2]}"
                attrs = profile_attrs(search.study, found, search.traces, name=name)
        except Exception:  # noqa: BLE001 - evidence, not a result: the finalizer profiles it
            return False
        shared.put(config, precision, attrs, search.study.study_name)
    return True
