"""The gate's verdicts, cached on the study: each config is checked once per study (once per
precision it ran in, in a study searching precisions: `tuner.search.spaces.space.candidate_key`).

A verdict is stored under `keys.PARITY_PREFIX` + the config's key (`GateVerdict.to_dict`), so every
later trial of the same config, the final round and every worker sharing the study read it instead
of running the gate again. The envelope (with the reference's losses in it) depends on the workload
alone: the first check measures it and it is stored once (`keys.ENVELOPE`); every later check is
given it, so the reference and the envelope run once per study. A config in another precision than
the study's is judged against another envelope, the reference's seed-to-seed one
(`keys.PRECISION_ENVELOPE`), likewise measured once.

Among the workers of one job (claims), a check whose config owes a twin leaves its own run to an
idle worker (`run_config`) unless it is made where its trial compiled: the losses are stored under
`keys.PARITY_RUN_PREFIX` + the config's key and judged once the twin has run.

With a memo (`tuner.search.gating.memo`: the same workload, shape, precision, code and machine),
both are also shared between studies: a verdict or envelope missing from the study is read from the
memo, copied onto the study (its record stays whole), and a new one is stored in both.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import optuna
import torch

from trainers import LoopConfig
from trainers.gate import required_test
from trainers.program import ProgramStopped
from tuner.evidence.progress import short_config
from tuner.search.gating.gate import Gate, GateRun, Pending, RunPending
from tuner.search.gating.verdict import GateVerdict
from tuner.search.measuring.timing import Clock
from tuner.search.options import Retry
from tuner.search.spaces.space import candidate_key
from tuner.store import keys
from tuner.store.jsonsafe import json_safe
from tuner.store.phases import GATE_CONFIG, GATE_TWIN, LABELS


class GateClaims(Protocol):
    """Which process runs which part of the gate, among the processes sharing one study (the
    workers of one job: `tuner.service.gatehelp.JobClaims`). A key is a verdict's or an
    envelope's attribute name. Without claims (one process) every check runs where it is asked.
    """

    wait_s: float
    """How often a process waiting for another's part reads the study again."""

    def take(self, key: str) -> bool:
        """Claim `key` for this process: False while another live process holds it."""
        ...

    def holder(self, key: str) -> str | None:
        """The live other process holding `key` (None: none, or this one)."""
        ...

    def release(self, key: str) -> None:
        """This process's part of `key` is over (stored, or it failed)."""
        ...


Beside = Callable[[], None] | None
"""How to wait for work started beside a check (`ParityCache.before_check`); None: none."""


def out_of_memory(exc: BaseException) -> bool:
    """Whether `exc` (raised here or in a child process) says the GPU ran out of memory."""
    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


class ParityCache:
    """`check(config, precision)`: the verdict from the study's cache, or from the gate (then
    stored). `reference`: the study's precision; a config in another is keyed and judged apart."""

    def __init__(
        self,
        study: optuna.Study,
        gate: Gate,
        *,
        retry: Retry,
        clock: Clock,
        reference: str | None = None,
        memo: optuna.Study | None = None,
        claims: GateClaims | None = None,
        say: Callable[[str], None] | None = None,
    ) -> None:
        self.study = study
        self.say = say
        """Where a check run here says that it starts and, once judged, its verdict and the
        seconds of each part (a progress line each: at 1B a check takes minutes)."""
        self.claims = claims
        """Set where other processes share the study (`Search.share_gate`): a verdict or an
        envelope another process is running is waited for, not run twice."""
        self.memo = memo
        self.reused = 0
        """Verdicts this process read from the memo instead of running the gate."""
        self.reused_envelopes: set[str] = set()
        """The envelopes (`keys.ENVELOPE`, `keys.PRECISION_ENVELOPE`: each with its reference's
        losses) this process read from the memo, measured by an earlier job, instead of running
        the reference and its envelope again."""
        self.reference = reference
        self.gate = gate
        self.retry = retry
        self.clock = clock
        self.largest_run_s = 0.0  # the most a check here spent on a twin and a run together
        self.before_check: Callable[[LoopConfig, str | None], Beside] | None = None
        """Called with a config and its precision just before the gate checks it here (not for a
        verdict read from the study or the memo): `Search.revive` starts the profiles' child's
        warm-up of the leader beside its gate. It returns how to wait for what it started (None:
        nothing started): a check that runs out of memory beside it waits, then runs again."""

    def verdict(self, config: LoopConfig, precision: str | None = None) -> GateVerdict:
        return self.check(config, precision)[0]

    def check(
        self, config: LoopConfig, precision: str | None = None
    ) -> tuple[GateVerdict, dict[str, float]]:
        """The verdict, and the seconds of each gate part run now (none when it was cached).
        `precision`: the config's (None: the study's)."""
        if precision == self.reference:
            precision = None
        attr = self.key(config, precision)
        attrs = self._attrs()
        cached = attrs.get(attr)
        if isinstance(cached, dict):
            return GateVerdict.from_dict(cached), {}
        if self.claims is not None and not self.claims.take(attr):
            # Another worker of the job is gating this config now: its verdict, once stored.
            found = self._wait_for(attr)
            if found is not None:
                return GateVerdict.from_dict(found), {}
            self.claims.take(attr)  # it went without a verdict: checked here
            attrs = self._attrs()
        try:
            return self._check(config, precision, attr, attrs)
        finally:
            if self.claims is not None:
                self.claims.release(attr)

    def has(self, config: LoopConfig, precision: str | None = None) -> bool:
        """Whether `config`'s verdict in `precision` costs this process no gate: stored on the
        study, in the memo of earlier studies, or being checked now by another process of the
        job (`claims`), whose verdict a check here waits for."""
        attr = self.key(config, precision)
        if self.claims is not None and self.claims.holder(attr) is not None:
            return True
        return self._stored(attr)

    def reuses_trial(self, config: LoopConfig, precision: str | None = None) -> bool:
        """Whether the gate makes `config`'s own run where its trial compiled, compiling
        nothing (`ParityProcess.runs_here`; False for a gate that does not say)."""
        here = getattr(self.gate, "runs_here", None)
        own = None if precision == self.reference else precision
        return bool(here is not None and here(config, own))

    def envelope_known(self, precision: str | None = None) -> bool:
        """Whether the envelope a config in `precision` is judged against is measured already
        (on the study or in the memo): else its first check measures it (and the reference)."""
        return self._stored(self.envelope_key(precision))

    def _stored(self, attr: str) -> bool:
        return any(isinstance(read().get(attr), dict) for read in (self._attrs, self._memo_attrs))

    def failed(self) -> set[str]:
        """The config keys whose cached verdict failed."""
        return {
            key.removeprefix(keys.PARITY_PREFIX)
            for key, verdict in self._attrs().items()
            if key.startswith(keys.PARITY_PREFIX)
            and isinstance(verdict, dict)
            and verdict.get("passed") is False
        }

    def key(self, config: LoopConfig, precision: str | None = None) -> str:
        """The study attribute of `config`'s verdict in `precision` (None: the study's)."""
        if precision == self.reference:
            precision = None
        return f"{keys.PARITY_PREFIX}{candidate_key(config, precision, self.reference)}"

    def _check(
        self, config: LoopConfig, precision: str | None, attr: str, attrs: dict[str, Any]
    ) -> tuple[GateVerdict, dict[str, float]]:
        shared = self._memo_attrs()
        # A config in another precision is judged against the reference's seed-to-seed
        # envelope (over the options' precision_parity_steps), stored apart from the rounding one.
        env_key = self.envelope_key(precision)
        if isinstance(shared.get(attr), dict):
            return self._copied(attr, env_key, attrs, shared), {}
        started = time.perf_counter()
        stored = attrs.get(env_key)
        if not isinstance(stored, dict) and isinstance(shared.get(env_key), dict):
            # Measured by an earlier job on the same model, shape, precision, code and machine.
            stored = shared[env_key]
            self._store(env_key, stored)
            self.reused_envelopes.add(env_key)
        envelope = stored if isinstance(stored, dict) else None
        pending, measures = self._envelope_plan(env_key, envelope)
        label = _label(config, precision)
        self._tell(f"gate: checking [{label}]" + _first_parts(envelope, pending))
        reached = True
        ran_here: list[str] = []  # the config's own run, where this process claimed it
        here: tuple[bool | str, str | None] = (False, None)  # GateRun.config_here, .twin_apart
        try:
            extra = self._check_options(config, precision, pending, ran_here)
            run = self._gate_check(config, envelope, extra)
            assert run.verdict is not None  # a check always judges
            if envelope is None:
                envelope = json_safe(run.envelope)
                self._store(env_key, envelope)
                if env_key not in shared:
                    self._share(env_key, envelope)
                    shared[env_key] = envelope
            made = "twin" if run.twin_here else run.config_here
            spent, here = dict(run.time), (made, run.twin_apart)
            verdict = GateVerdict(verdict=run.verdict, config=config.to_dict())
        except Exception as exc:  # a config that cannot even be checked fails
            # Neither a cancel nor what fails every config alike (the job ends on it) is a verdict.
            if isinstance(exc, ProgramStopped) or getattr(exc, "every_config", False):
                raise
            verdict = GateVerdict.failed(f"parity run failed: {exc}", config=config)
            spent = {GATE_CONFIG: time.perf_counter() - started}
            reached = False  # a fact about this moment (another process's memory, ...): not shared
        finally:
            for held in [env_key] * measures + ran_here:  # what this check claimed
                assert self.claims is not None
                self.claims.release(held)
        self.clock.add(spent)
        if reached:
            ran = spent.get(GATE_TWIN, 0.0) + spent.get(GATE_CONFIG, 0.0)
            self.largest_run_s = max(self.largest_run_s, ran)
        verdict = dataclasses.replace(verdict, seconds=time.perf_counter() - started, time=spent)
        outcome = "passed" if verdict.passed else "failed"
        self._tell(f"gate: [{label}] {outcome} in {verdict.seconds:.0f} s{_parts(spent, *here)}")
        self._store(attr, verdict.to_dict())
        # Shared only when judged against the memo's own envelope: a study resumed after its
        # inputs changed judges by the envelope it stored then, which holds for it alone.
        if reached and shared.get(env_key) == envelope:
            self._share(attr, verdict.to_dict())
        return verdict, spent

    def _gate_check(
        self, config: LoopConfig, envelope: dict[str, Any] | None, extra: dict[str, Any]
    ) -> GateRun:
        """`gate.check`, with the work `before_check` starts beside it. Where this check would
        measure the envelope, it is measured first and alone: the reference's eager runs fall
        back to smaller stand-ins when they run out of memory (`trainers.gate.trajectories`), so
        memory taken beside them would change the envelope without a word. A check that runs
        out of GPU memory beside that work waits for it, then runs again alone."""
        first: dict[str, float] = {}
        if self.before_check is not None and envelope is None and "pending" not in extra:
            measured = self.gate.envelope(precision=extra.get("precision"))
            envelope, first = measured.envelope, dict(measured.time)
        beside = self._beside(config, extra.get("precision"))
        try:
            run = self.gate.check(config, envelope, **extra)
        except Exception as exc:
            if beside is None or not out_of_memory(exc):
                raise
            beside()
            self._tell(
                f"gate: [{_label(config, extra.get('precision'))}] ran out of memory beside the "
                "profiles' warm-up: checked again alone"
            )
            run = self.gate.check(config, envelope, **extra)
        return dataclasses.replace(run, time=first | dict(run.time)) if first else run

    def _beside(self, config: LoopConfig, precision: str | None) -> Beside:
        """Start `before_check`'s work; how to wait for it (None: none, or it failed, which is
        said and is never the config's verdict)."""
        if self.before_check is None:
            return None
        try:
            return self.before_check(config, precision)
        except Exception as exc:  # noqa: BLE001 - the gate goes on without it
            self._tell(f"gate: nothing runs beside it ({type(exc).__name__}: {exc})"[:300])
            return None

    def _check_options(
        self,
        config: LoopConfig,
        precision: str | None,
        pending: Pending | None,
        ran_here: list[str],
    ) -> dict[str, Any]:
        """`Gate.check`'s keyword arguments: the config's precision (None: the study's), the
        envelope measured elsewhere (`pending`), and where other workers share the study and
        the check runs a twin, its own run as another worker may take it (`_run_plan`), unless
        made where its trial compiled (`reuses_trial`), not in a helper's cold compile."""
        extra: dict[str, Any] = {} if pending is None else {"pending": pending}
        if precision is not None:
            extra["precision"] = precision
        apart = self.claims is not None and self.gate.runs_apart
        if apart and self.owes_twin(config, precision) and not self.reuses_trial(config, precision):
            extra["run"] = self._run_plan(self.run_key(config, precision), ran_here)
        return extra

    def _envelope_plan(
        self, env_key: str, envelope: dict[str, Any] | None
    ) -> tuple[Pending | None, bool]:
        """Where a check without a stored envelope gets it, among workers sharing the study: the
        one another worker is measuring now (`measure_envelope`), waited for once this check's
        twin has run; else measured in this check, claimed meanwhile so that no helper measures
        it too. Returns that wait (None: none) and whether this check measures it under claim."""
        claims = self.claims
        if envelope is not None or claims is None:
            return None, False
        if claims.take(env_key):
            return None, True
        return (lambda: self._wait_for(env_key)), False

    def owes_twin(self, config: LoopConfig, precision: str | None = None) -> bool:
        """Whether `config`'s check runs an eager twin beside its own run (`required_test`): only
        such a check has a run to leave to another worker."""
        own = precision if precision is not None else self.reference
        test = required_test(
            config,
            precision=own,  # type: ignore[arg-type]  # RunOptions checked it
            reference_precision=self.reference,  # type: ignore[arg-type]
        )
        return test == "exact+equivalence"

    def run_key(self, config: LoopConfig, precision: str | None = None) -> str:
        """The study attribute of `config`'s own run in `precision`, run apart from its check."""
        return keys.PARITY_RUN_PREFIX + self.key(config, precision).removeprefix(keys.PARITY_PREFIX)

    def _run_plan(self, run_key: str, ran_here: list[str]) -> RunPending:
        """The check's `run`, asked once its twin has run: the losses another worker stored or
        is running now (waited for), else None with the run claimed here (named in `ran_here`,
        given back when the check ends) so that no helper starts it too."""
        claims = self.claims
        assert claims is not None

        def losses() -> Sequence[float] | None:
            found = self._attrs().get(run_key)
            if isinstance(found, dict):
                return _losses(found)
            if claims.take(run_key):
                ran_here.append(run_key)
                return None
            found = self._wait_for(run_key)
            return None if found is None else _losses(found)

        return losses

    def run_config(self, config: LoopConfig, precision: str | None = None) -> bool:
        """`config`'s own run, run now for the check another worker holds (its twin running
        there), where its verdict and its run are neither stored nor being run elsewhere; the
        losses are stored for that check. Whether it ran here."""
        if precision == self.reference:
            precision = None
        run_key = self.run_key(config, precision)
        attrs = self._attrs()
        if self.key(config, precision) in attrs or run_key in attrs or not self.gate.runs_apart:
            return False
        if self.claims is not None and not self.claims.take(run_key):
            return False
        try:
            extra = {} if precision is None else {"precision": precision}
            started = time.perf_counter()
            run = self.gate.config_run(config, **extra)
            stored = {
                # As hexadecimal: the twin's exact test compares them bit for bit.
                "losses": [float(x).hex() for x in run.losses],
                keys.SECONDS: time.perf_counter() - started,
                "time": dict(run.time),
            }
            self._store(run_key, stored)
            self.clock.add(dict(run.time))
        finally:
            if self.claims is not None:
                self.claims.release(run_key)
        return True

    def _wait_for(self, key: str) -> dict[str, Any] | None:
        """`key`'s value once the process holding its claim stored it; None when that process
        ended or gave the claim up without storing it."""
        claims = self.claims
        assert claims is not None
        while True:
            found = self._attrs().get(key)
            if isinstance(found, dict):
                return found
            if claims.holder(key) is None:
                found = self._attrs().get(key)  # stored just before the claim was given back
                return found if isinstance(found, dict) else None
            time.sleep(claims.wait_s)

    def measure_envelope(self, precision: str | None = None) -> bool:
        """The envelope a config in `precision` (None: the study's) is judged against, measured
        now on its own (a worker with no trial left while the job's others run theirs), where
        neither the study nor the memo has it and no other worker is measuring it. Whether it
        was measured here."""
        if precision == self.reference:
            precision = None
        env_key = self.envelope_key(precision)
        if isinstance(self._attrs().get(env_key), dict):
            return False
        shared = self._memo_attrs()
        if isinstance(shared.get(env_key), dict):
            self._store(env_key, shared[env_key])
            self.reused_envelopes.add(env_key)
            return False
        if self.claims is not None and not self.claims.take(env_key):
            return False
        try:
            run = (
                self.gate.envelope()
                if precision is None
                else self.gate.envelope(precision=precision)
            )
            envelope = json_safe(run.envelope)
            self._store(env_key, envelope)
            self._share(env_key, envelope)
            self.clock.add(dict(run.time))
        finally:
            if self.claims is not None:
                self.claims.release(env_key)
        return True

    def envelope_key(self, precision: str | None = None) -> str:
        """The study attribute of the envelope a config in `precision` (None: the study's) is
        judged against: the rounding one in the study's precision, the reference's seed-to-seed
        one in another (the module doc)."""
        if precision == self.reference:
            precision = None
        return keys.ENVELOPE if precision is None else keys.PRECISION_ENVELOPE

    def _copied(
        self, attr: str, env_key: str, attrs: dict[str, Any], shared: dict[str, Any]
    ) -> GateVerdict:
        """A verdict an earlier study of the same inputs reached (tuner.search.gating.memo): the
        study keeps its own copy, with no seconds spent here (`gpu_seconds` adds them up), and
        the envelope it was judged by."""
        found = dataclasses.replace(GateVerdict.from_dict(shared[attr]), seconds=0.0, time={})
        self._store(attr, found.to_dict())
        if env_key not in attrs and isinstance(shared.get(env_key), dict):
            self._store(env_key, shared[env_key])  # what the verdict judged by
            self.reused_envelopes.add(env_key)
        self.reused += 1
        return found

    def known(self) -> int:
        """How many verdicts the memo holds (0 without one)."""
        return sum(1 for k in self._memo_attrs() if k.startswith(keys.PARITY_PREFIX))

    def _tell(self, text: str) -> None:
        if self.say is not None:
            self.say(text)

    def _attrs(self) -> dict[str, Any]:
        return self.retry.call(lambda: self.study.user_attrs, what="reading the parity cache")

    def _memo_attrs(self) -> dict[str, Any]:
        if (memo := self.memo) is None:
            return {}
        return self.retry.call(lambda: memo.user_attrs, what="reading the shared verdicts")

    def _share(self, key: str, value: Any) -> None:
        if (memo := self.memo) is not None:
            self.retry.call(lambda: memo.set_user_attr(key, value), what=f"sharing {key}")

    def _store(self, key: str, value: Any) -> None:
        self.retry.call(lambda: self.study.set_user_attr(key, value), what=f"storing {key}")


def _losses(stored: dict[str, Any]) -> list[float]:
    """A run's losses as `ParityCache.run_config` stored them."""
    return [float.fromhex(x) for x in stored["losses"]]


def _label(config: LoopConfig, precision: str | None) -> str:
    """A config as the progress lines name it: what differs from PyTorch's default loop."""
    shown = short_config(config.to_dict())
    return shown if precision is None else f"{shown}, {precision}"


def _first_parts(envelope: dict[str, Any] | None, pending: Pending | None) -> str:
    """What a check runs before its config's own run: said, because at 1B it takes minutes."""
    if envelope is not None:
        return ": its twin where it needs one, then its own run"
    if pending is not None:
        return ": its twin, while another worker measures the envelope"
    return ": the reference and its envelope first (once per study), then the config"


def _parts(spent: dict[str, float], here: bool | str = False, apart: str | None = None) -> str:
    """` (reference 30 s, twin 105 s, ...)`: each part's seconds (none under a second), whether
    the config's run ("twin": with its eager twin) was made in this process, where its trial
    compiled, and why an eager twin ran in the child instead (`apart`)."""
    made = "twin and config run" if here == "twin" else "config run"
    shown = [
        f"{LABELS.get(k, k).removeprefix('gate: ')} {s:.0f} s" for k, s in spent.items() if s >= 0.5
    ] + ([f"{made} made where its trial compiled"] if here else [])
    said = f" ({', '.join(shown)})" if shown else ""
    return said if apart is None else f"{said}; twin in the child: {apart}"
