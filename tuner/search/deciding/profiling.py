"""What the search profiles: a trial (`--profile all`) and, after deciding, the baselines and
the recommended config; in this process on a CPU, in a child process on a GPU.

A profile after deciding is shared between studies of the same inputs (`SharedProfiles`, on the
gate's memo, `tuner.search.gating.memo`): a user's second job on the same model profiles the same
two baselines, and often recommends the same config, as the first. Measured on an H100 (GPT-2 124M,
the default job at 73b9fe6, `docs/benchmarks/default-job-h100-2026-11-25-gpt2.*`), the warm job
spent 40 s of its 377 s profiling configs the cold job had profiled minutes before.

The workers of one `--gpus N` job share them the same way, on the job's study when there is no
memo: a worker with no trial left profiles the baselines, and once no trial runs the leading
config whose gate has not failed, while the finalizer runs the final round
(`tuner.search.search.Search.help_gate`), each
profile claimed once (`GateClaims`), and the finalizer waits for one being taken rather than take
it again.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import optuna
import torch

import trainers
from trainers import LoopConfig, Workload
from tuner.evidence.profiles import store_profile, study_profiles
from tuner.evidence.recommendation import Recommendation
from tuner.evidence.trace import Profile, profile_config
from tuner.evidence.verdicts import Verdict, explain, verdict
from tuner.search.gating.memo import MEMO_ENV
from tuner.search.gating.parity import GateClaims
from tuner.search.options import Retry
from tuner.search.spaces.space import candidate_key
from tuner.store.keys import MEMO_PROFILE_PREFIX, PROFILE_ERROR, PROFILE_PREFIX, PROFILE_RECOMMENDED

Profiler = Callable[..., Profile]
"""`profiler(config)` profiles in the study's precision; `profiler(config, precision=p)` in p."""


def in_process(
    workload: Workload,
    *,
    device: str | torch.device,
    steps: int = 10,
    warmup: int = 5,
    precision: trainers.Precision | None = None,
) -> Profiler:
    """A profiler that profiles in this process (on a CPU; on a GPU the tuner profiles in a
    child process, `tuner.search.deciding.profile_child.ProfileProcess`, since CUPTI outlasts the
    profile)."""
    return functools.partial(
        profile_config, workload, steps=steps, warmup=warmup, device=device, precision=precision
    )


def profile_trial(
    trial: optuna.Trial,
    config: LoopConfig,
    directory: Path | None,
    profiler: Profiler,
    *,
    precision: str | None = None,
) -> None:
    """`--profile all`: profile a trial's config (in its `precision`; None: the study's) and
    store it on the (running) trial. A failure is recorded as the attribute `profile_error`,
    never raised: the trial's measurement stands."""
    try:
        profile = profiler(config) if precision is None else profiler(config, precision=precision)
        store_profile(trial, profile, directory)
    except Exception as exc:  # noqa: BLE001 - a profile is evidence, not the trial's result
        trial.set_user_attr(PROFILE_ERROR, f"{type(exc).__name__}: {exc}"[:2000])


class SharedProfiles:
    """Profiles of configs shared between studies through the memo study
    (`tuner.search.gating.memo`: the same code, libraries, workload, shape, precision and machine),
    keyed by the config's candidate key and the profile's settings (`settings`: steps and warm-up).
    A copy claims no seconds and names the study that measured it (`shared_from`); its trace stays
    that study's artifact (the same artifact store where the storage is the same)."""

    def __init__(
        self,
        memo: optuna.Study,
        *,
        settings: str,
        reference: str | None,
        retry: Retry,
        claims: GateClaims | None = None,
    ) -> None:
        self.memo = memo
        self.settings = settings
        self.reference = reference
        self.retry = retry
        self.claims = claims
        """Set where a job's workers share the study (module doc): who is taking which profile."""

    def known(self, config: LoopConfig, precision: str | None) -> dict[str, Any] | None:
        """The profile stored, or the one another worker is taking now once it is stored (None:
        neither, or that worker went without storing it)."""
        found = self.get(config, precision)
        claims = self.claims
        if found is not None or claims is None:
            return found
        key = self.key(config, precision)
        while claims.holder(key) is not None:
            time.sleep(claims.wait_s)
            found = self.get(config, precision)
            if found is not None:
                return found
        return self.get(config, precision)

    def take(self, config: LoopConfig, precision: str | None) -> bool:
        """Claim this profile for this process (always, without claims)."""
        return self.claims is None or self.claims.take(self.key(config, precision))

    def release(self, config: LoopConfig, precision: str | None) -> None:
        if self.claims is not None:
            self.claims.release(self.key(config, precision))

    @contextlib.contextmanager
    def claimed(self, config: LoopConfig, precision: str | None) -> Iterator[None]:
        """Hold this profile's claim while it is taken and stored (where it could be taken)."""
        held = self.take(config, precision)
        try:
            yield
        finally:
            if held:
                self.release(config, precision)

    def key(self, config: LoopConfig, precision: str | None) -> str:
        candidate = candidate_key(config, precision, self.reference)
        return f"{MEMO_PROFILE_PREFIX}{candidate}/{self.settings}"

    def get(self, config: LoopConfig, precision: str | None) -> dict[str, Any] | None:
        key = self.key(config, precision)
        found = self.retry.call(lambda: self.memo.user_attrs, what="reading shared profiles")
        value = found.get(key)
        return dict(value) if isinstance(value, dict) else None

    def put(
        self, config: LoopConfig, precision: str | None, attrs: Mapping[str, Any], study: str
    ) -> None:
        key = self.key(config, precision)
        value = {**attrs, "shared_from": study}
        self.retry.call(lambda: self.memo.set_user_attr(key, value), what=f"sharing {key}")


ProfileCut = Callable[[LoopConfig, "str | None", bool], "str | None"]
"""`(config, its precision or None for the study's, whether a profile ran before)` -> why not to
profile it now (`time_cut`), or None."""


CompileSeconds = Callable[[LoopConfig, "str | None"], float]
"""`(config, its precision or None for the study's)` -> the seconds its trials compiled it
(`tuner.search.deciding.aim.trial_compile`; 0: none did)."""


def time_cut(
    wall: Callable[[], float],
    aim_s: float,
    *,
    child_s: float,
    eager_s: float,
    compiled_s: float,
    warmed: tuple[LoopConfig, str | None] | None = None,
    margin_s: float = 0.0,
    compiled_for: CompileSeconds | None = None,
) -> ProfileCut:
    """A `cut` for `profile_recommendation`: a profile starts only where the job's time so far
    (`wall()`) and its expected cost (`eager_s` or `compiled_s`, by the config's compile, and
    `child_s` for the child process when no profile ran before it) end `margin_s` inside
    `aim_s`. The
    config the profiles' child already ran and compiled, in that precision (`warmed`), costs
    what an eager one does; the same config in another precision compiles again. A compiled
    config whose trials compiled longer (`compiled_for`) is expected to take that compile again
    and an eager profile's seconds: at the Qwen2-style shape on one H200 (2026-12-04) trial 11
    compiled 105.6 s and its profile then took 144 s (compile 131 s), against `compiled_s`'
    90 s."""

    def cut(config: LoopConfig, precision: str | None, child_started: bool) -> str | None:
        kept = config.compile == "none" or warmed == (config, precision)
        expected = eager_s if kept else compiled_s
        if not kept and compiled_for is not None:
            expected = max(expected, compiled_for(config, precision) + eager_s)
        expected += 0.0 if child_started else child_s
        so_far = wall()
        if so_far + expected + margin_s <= aim_s:
            return None
        return (
            f"the job had run {so_far:.0f} s and this profile takes about {expected:.0f} s; "
            f"on the scale space profiles end {margin_s:.0f} s inside {aim_s:.0f} s "
            f"(--profile all takes every one)"
        )

    return cut


def profile_recommendation(
    study: optuna.Study,
    recommendation: Recommendation,
    baselines: Mapping[str, LoopConfig],
    directory: Path | None,
    profiler: Profiler,
    *,
    shared: SharedProfiles | None = None,
    cut: ProfileCut | None = None,
) -> Recommendation:
    """Profile the baselines, then the recommended config, store them on the study, and return
    the recommendation with the profiles' `verdicts` (name -> verdict) and `explanation`.
    `shared`: profiles an earlier study of the same inputs measured are copied from it (and
    this study's are shared) instead of measured again. `cut` (optional), asked before each
    profile is measured with its config, its precision and whether a profile was measured before
    it: a reason not to (the job's time) leaves it out, the reason recorded in `profile_errors`;
    None goes on."""
    targets: dict[str, LoopConfig] = dict(baselines)
    if recommendation.config is not None:
        targets[PROFILE_RECOMMENDED] = LoopConfig.from_dict(recommendation.config)
    measured = False
    verdicts: dict[str, Verdict] = {}
    errors: dict[str, str] = {}
    for name, config in targets.items():
        # The recommended config in the precision it was chosen in (a study searching them).
        chosen = recommendation.precision if name == PROFILE_RECOMMENDED else None
        known = shared.known(config, chosen) if shared is not None else None
        if known is not None:
            # Measured by an earlier study of the same inputs: the copy claims no seconds here.
            copy = {**known, "seconds": 0.0}
            study.set_user_attr(f"{PROFILE_PREFIX}{name}", copy)
            verdicts[name] = verdict(Profile.from_attrs(copy))
            continue
        reason = cut(config, chosen, measured) if cut is not None else None
        if name in recommendation.failures:
            # Its run failed in the final round (out of memory, say): a profile runs it again.
            reason = f"it failed in the final round ({recommendation.failures[name][:200]})"
        if reason is not None:
            errors[name] = f"not profiled: {reason}"
            continue
        measured = True
        with shared.claimed(config, chosen) if shared is not None else contextlib.nullcontext():
            try:
                prof = profiler(config) if chosen is None else profiler(config, precision=chosen)
            except Exception as exc:  # noqa: BLE001 - recorded; the recommendation stands
                errors[name] = f"{type(exc).__name__}: {exc}"[:2000]
                with contextlib.suppress(Exception):
                    study.set_user_attr(f"{PROFILE_PREFIX}{name}", {"error": errors[name]})
                continue
            store_profile(study, prof, directory, name=name)
            verdicts[name] = verdict(prof)
            if shared is not None:
                stored = study.user_attrs[f"{PROFILE_PREFIX}{name}"]
                shared.put(config, chosen, stored, study.study_name)
    return recommendation.with_evidence(
        verdicts={name: v.to_dict() for name, v in verdicts.items()},
        explanation=explain(recommendation.to_dict(), verdicts),
        profile_errors=errors,
    )


def _looked(attrs: Mapping[str, Any]) -> str:
    """What a profile's compile found in Inductor's FX-graph cache, for its progress line: a
    compile again that missed what the trial wrote costs the whole compile."""
    found = attrs.get("compile_cache")
    if not isinstance(found, dict):
        return ""
    hits, misses = int(found.get("hits", 0)), int(found.get("misses", 0))
    return f"; FX-graph cache: {hits} of {hits + misses} graphs hit"


def said(study: optuna.Study, recommendation: Recommendation) -> list[str]:
    """The progress lines after the profiles: each one left out on purpose (its own reason),
    where each measured one's seconds went (a compile again, or the trace), and which were
    copied from an earlier study."""
    lines = [
        f"profile of {name} {error}"
        for name, error in (recommendation.profile_errors or {}).items()
        if error.startswith("not profiled")  # the job's time, a run that failed
    ]
    stored = study_profiles(study)
    copied = [
        name
        for name, attrs in stored.items()
        if attrs.get("shared_from") not in (None, study.study_name)
    ]
    for name, attrs in stored.items():
        parts = attrs.get("phases") if name not in copied else None
        if isinstance(parts, dict) and parts:
            spent = ", ".join(f"{part} {seconds:.0f} s" for part, seconds in parts.items())
            lines.append(f"profile of {name}: {attrs['seconds']:.0f} s ({spent}){_looked(attrs)}")
    if copied:
        lines.append(
            f"profiles of {', '.join(copied)}: from earlier studies of this workload, "
            f"shape and precision on this machine and code ({MEMO_ENV}=off profiles them again)"
        )
    return lines
