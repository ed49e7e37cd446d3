"""A config's gate verdict as the search stores it (`GateVerdict`): on a trial and on the study (its
cache), the typed `trainers.gate.ParityVerdict` whole (through its own `to_dict`/`from_dict`, so a
field added there passes through), the config, the seconds and the parts' times, in one flat JSON
object. `from_dict` also reads the dicts earlier versions stored (a failed run's three keys, a
program's verdict)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from trainers import LoopConfig
from trainers.gate import ParityVerdict
from tuner.store.jsonsafe import json_safe_dict

# What a dict stored before verdicts were typed may lack: a failed run stored only `passed`,
# `reason` and `max_rel_deviation`, a program's verdict a nested `equivalence` too.
_LEGACY_DEFAULTS: dict[str, Any] = {
    "exact_required": False,
    "tolerance": 0.0,
    "steps": 0,
    "max_abs_deviation": math.inf,
    "max_rel_deviation": math.inf,
    "first_diverging_step": None,
}
# The search's own keys beside the verdict's fields in the stored JSON.
_OWN_KEYS = ("config", "seconds", "time")


@dataclasses.dataclass(frozen=True, kw_only=True)
class GateVerdict:
    """A config's gate verdict as stored: the verdict, the config, its seconds, the parts' times."""

    verdict: ParityVerdict
    config: dict[str, Any] | None = None
    seconds: float = 0.0
    """Wall seconds of the check (0 for a verdict read back from the cache)."""
    time: dict[str, float] = dataclasses.field(default_factory=dict)
    """Seconds of each part of the gate this check ran (`tuner.store.phases.GATE_PHASES`)."""

    @property
    def passed(self) -> bool:
        return self.verdict.passed

    @property
    def reason(self) -> str:
        return self.verdict.reason

    def failure_reason(self) -> str:
        """The trial's `failure_reason` when the verdict failed it."""
        deviation = self.verdict.max_rel_deviation
        shown = "inf" if deviation is None or not math.isfinite(deviation) else f"{deviation:.3g}"
        return (
            f"parity: {self.verdict.reason} (test {self.verdict.test}; "
            f"max relative deviation {shown})"
        )

    def to_dict(self) -> dict[str, Any]:
        """The flat JSON stored on the trial and the study: the verdict's fields, then ours."""
        data = self.verdict.to_dict() | {"seconds": self.seconds, "time": dict(self.time)}
        if self.config is not None:
            data["config"] = dict(self.config)
        return json_safe_dict(data)

    def public(self) -> dict[str, Any]:
        """The verdict's JSON without the config (the recommendation's `parity`)."""
        return {k: v for k, v in self.to_dict().items() if k != "config"}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GateVerdict:
        """Read a stored verdict, of this version or an earlier one (see `_LEGACY_DEFAULTS`)."""
        fields = {k: v for k, v in data.items() if k not in _OWN_KEYS}
        nested = fields.pop("equivalence", None)
        if isinstance(nested, Mapping):  # a program's verdict before verdicts were typed
            fields = {**nested, **fields}
            fields.setdefault("tolerance", nested.get("bound"))
        for key, default in _LEGACY_DEFAULTS.items():
            if fields.get(key) is None and key not in ("first_diverging_step",):
                # JSON turned an infinite deviation into null: read it back as infinite.
                fields[key] = default
        fields.setdefault("first_diverging_step", None)
        config = data.get("config")
        return cls(
            verdict=ParityVerdict.from_dict(fields),
            config=None if config is None else dict(config),
            seconds=float(data.get("seconds") or 0.0),
            time={k: float(v) for k, v in (data.get("time") or {}).items()},
        )

    @classmethod
    def failed(cls, reason: str, *, config: LoopConfig | None = None) -> GateVerdict:
        """A config the gate could not even check: it fails."""
        fields = _LEGACY_DEFAULTS | {"passed": False, "reason": reason}
        return cls(
            verdict=ParityVerdict(**fields),
            config=None if config is None else config.to_dict(),
        )
