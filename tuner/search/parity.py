"""The gate's verdicts, cached on the study: each config is checked once per study (once per
precision it ran in, in a study searching precisions: `tuner.search.space.candidate_key`).

A verdict is stored under `keys.PARITY_PREFIX` + the config's key (`GateVerdict.to_dict`), so
every later trial of the same config, the final round and every worker sharing the study read it
instead of running the gate again. The envelope (with the reference's losses in it) depends on
the workload alone: the first check measures it and it is stored once (`keys.ENVELOPE`); every
later check is given it, so the reference and the envelope run once per study.
"""

from __future__ import annotations

import time
from typing import Any

import optuna

from trainers import LoopConfig
from tuner.search.gate import Gate, GateVerdict
from tuner.search.options import Retry
from tuner.search.space import candidate_key
from tuner.search.timing import Clock
from tuner.store import keys
from tuner.store.jsonsafe import json_safe
from tuner.store.phases import GATE_CONFIG


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
    ) -> None:
        self.study = study
        self.reference = reference
        self.gate = gate
        self.retry = retry
        self.clock = clock

    def verdict(self, config: LoopConfig, precision: str | None = None) -> GateVerdict:
        return self.check(config, precision)[0]

    def check(
        self, config: LoopConfig, precision: str | None = None
    ) -> tuple[GateVerdict, dict[str, float]]:
        """The verdict, and the seconds of each gate part run now (none when it was cached).
        `precision`: the config's (None: the study's)."""
        if precision == self.reference:
            precision = None
        attr = f"{keys.PARITY_PREFIX}{candidate_key(config, precision, self.reference)}"
        attrs = self._attrs()
        cached = attrs.get(attr)
        if isinstance(cached, dict):
            return GateVerdict.from_dict(cached), {}
        started = time.perf_counter()
        stored = attrs.get(keys.ENVELOPE)
        envelope = stored if isinstance(stored, dict) else None
        try:
            run = (
                self.gate.check(config, envelope)
                if precision is None
                else self.gate.check(config, envelope, precision=precision)
            )
            if envelope is None:
                self._store(keys.ENVELOPE, json_safe(run.envelope))
            spent = dict(run.time)
            verdict = GateVerdict(verdict=run.verdict, config=config.to_dict())
        except Exception as exc:  # noqa: BLE001 - a config that cannot even be checked fails
            verdict = GateVerdict.failed(f"parity run failed: {exc}", config=config)
            spent = {GATE_CONFIG: time.perf_counter() - started}
        self.clock.add(spent)
        verdict = GateVerdict(
            verdict=verdict.verdict,
            config=verdict.config,
            seconds=time.perf_counter() - started,
            time=spent,
        )
        self._store(attr, verdict.to_dict())
        return verdict, spent

    def _attrs(self) -> dict[str, Any]:
        return self.retry.call(lambda: self.study.user_attrs, what="reading the parity cache")

    def _store(self, key: str, value: Any) -> None:
        self.retry.call(lambda: self.study.set_user_attr(key, value), what=f"storing {key}")
