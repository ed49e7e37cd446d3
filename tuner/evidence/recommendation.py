"""`Recommendation`: what the tuner recommends for a study, typed, with its JSON round trip.

`tuner.search.deciding.decide` builds one after the final round; the search adds the profiles'
verdicts and explanation (`with_evidence`) and stores `to_dict()` on the study (`tuner.store.keys.
RECOMMENDATION`) and on a job's row. Every reader (`best`, `export`, `studies`, the report, the
API) goes through `Recommendation.from_dict`, so the JSON has one shape: `from_dict(r.to_dict())
== r`, and a dict stored by an earlier version (fewer keys) still reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from tuner.store.counting import TrialCounts
from tuner.store.jsonsafe import json_safe_dict


@dataclasses.dataclass(frozen=True, slots=True)
class Interval:
    """A median with its 95 % bootstrap interval (None where the interval is undefined)."""

    median: float
    ci95: tuple[float | None, float | None]

    def to_dict(self) -> dict[str, Any]:
        return {"median": self.median, "ci95": list(self.ci95)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Interval:
        low, high = [*(data.get("ci95") or []), None, None][:2]
        return cls(median=float(data["median"]), ci95=(low, high))


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """One config of the final round: its name, config and measured throughput."""

    name: str
    config: dict[str, Any]
    throughput: Interval | None
    peak_memory_bytes: int | None
    samples: int
    precision: str | None = None
    """The precision it ran in, when not the study's (a study searching precisions)."""

    def to_dict(self) -> dict[str, Any]:
        data = {
            "name": self.name,
            "config": dict(self.config),
            "throughput": None if self.throughput is None else self.throughput.to_dict(),
            "peak_memory_bytes": self.peak_memory_bytes,
            "samples": self.samples,
        }
        if self.precision is not None:
            data["precision"] = self.precision
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Entry:
        return cls(
            name=data["name"],
            config=dict(data["config"]),
            throughput=(
                None if not data.get("throughput") else Interval.from_dict(data["throughput"])
            ),
            peak_memory_bytes=data.get("peak_memory_bytes"),
            samples=int(data.get("samples", 0)),
            precision=data.get("precision"),
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Floor:
    """The graph floor measured for the workload, and floor / recommended step time."""

    step_ms: float
    ratio: float


# Keys copied from the study's metadata into the recommendation, as stored there.
CPU_RUN_NOTE = (
    "measured on a CPU: stream, event and pinned-memory settings have no effect there, so "
    "differences between configs are noise; tune on the GPU you train on"
)
"""The note of every recommendation made on a CPU; what a run there could not do follows it."""

STUDY_FIELDS = (
    "workload",
    "preset",
    "model_args",
    "seed",
    "precision",
    "precisions",
    "device",
    "hardware",
    "fingerprint",
    "matmul_precision",
    "model",  # what model it measured (`tuner.search.identity`); the exported script checks it
    "nproc_per_node",  # the processes a data-parallel config trains in (the exported script's)
    # The question's own settings, that the command "on a GPU, run" repeats (it had asked
    # another question without them: a probe, 2026-12-07).
    "objectives",
    "fix",  # the user's pins (`--fix`, a job's `fix`), not the ones the device forced
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Recommendation:
    """The outcome of a study's final round (see `tuner.search.deciding.decide` for how it is
    decided).

    `config` is None when no config passed the correctness gate (and the memory cap): `reason`
    says why. Speedups are over each baseline measured in the same final round.
    """

    study: str
    config: dict[str, Any] | None
    reason: str | None
    trial_counts: TrialCounts
    gpu_seconds: float
    final_round: tuple[Entry, ...] = ()
    failures: dict[str, str] = dataclasses.field(default_factory=dict)
    tie_rule: str | None = None
    tie_margin: float | None = None
    max_memory_bytes: int | None = None
    study_fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    """workload, preset, model_args, seed, precision (the study's reference precision),
    precisions (the ones it searched; None: `precision` alone), device, hardware, fingerprint,
    matmul_precision, model, nproc_per_node, objectives and fix (the user's pins): STUDY_FIELDS."""
    effective: bool = True
    note: str | None = None
    pareto: tuple[Entry, ...] | None = None
    source: str | None = None
    throughput: Interval | None = None
    step_ms: float | None = None
    peak_memory_bytes: int | None = None
    utilisation: dict[str, Any] | None = None
    """Model FLOPs of the recommended step: `tflops`, `mfu` (0..1; None on a CPU or an unknown
    GPU), `peak_tflops`, `note` (what the MFU is counted against, or why there is none) and
    `recompute_share` (FLOPs its activation checkpointing computes again, a share of the
    model's: compute beyond the MFU)."""
    device_memory_bytes: int | None = None
    """The device's total memory: the recommendation's headroom is this less its peak."""
    speedup: dict[str, Interval] = dataclasses.field(default_factory=dict)
    ties: tuple[Entry, ...] = ()
    was_tie: bool | None = None
    floor: Floor | None = None
    setup_s: float | None = None
    """One-off seconds the recommended config pays before its first step (compilation)."""
    break_even_steps: dict[str, int | None] = dataclasses.field(default_factory=dict)
    """Per baseline: training steps after which that setup has paid for itself (None: never)."""
    train_steps: int | None = None
    """The planned run length the recommendation was ranked for (`--train-steps`), if given."""
    parity: dict[str, Any] | None = None
    """The correctness gate's verdict for the recommended config: which test applied (exact,
    equivalence), the envelope, the deviation and the reason (`trainers.ParityVerdict`)."""
    verdicts: dict[str, dict[str, Any]] | None = None
    explanation: str | None = None
    profile_errors: dict[str, str] | None = None
    precision: str | None = None
    """In a study that searched precisions (`study_fields["precisions"]`), the one the
    recommended config runs in (None elsewhere: the study's). In the JSON, `precision` is always
    the precision to train in, and such a study adds `reference_precision`, the study's."""
    search: dict[str, Any] | None = None
    """How the search spent its trials (`tuner.search.Search._search_record`): trials predicted,
    skipped on a prediction, screened out, gated and complete, how often the predictions were
    right, and the gate references reused from an earlier job; None before it was recorded."""
    time: dict[str, Any] | None = None
    """Where the study's time went up to this recommendation (`tuner.store.phases.study_time`):
    `wall_s`, `phases` (seconds per phase, `idle` included) and `sessions`; None for a study
    recorded before phases were."""

    @property
    def headroom_bytes(self) -> int | None:
        """Device memory the recommended config leaves unused at its peak (None on a CPU)."""
        if self.device_memory_bytes is None or self.peak_memory_bytes is None:
            return None
        return self.device_memory_bytes - self.peak_memory_bytes

    @property
    def trained_precision(self) -> str | None:
        """The precision to train the recommended config in: the chosen one, or the study's."""
        return self.precision or self.study_fields.get("precision")

    @property
    def precisions(self) -> list[str] | None:
        """The precisions the study searched (None: it was fixed to one)."""
        value = self.study_fields.get("precisions")
        return None if not value else list(value)

    @property
    def workload(self) -> str | None:
        return self.study_fields.get("workload")

    @property
    def preset(self) -> str | None:
        return self.study_fields.get("preset")

    @property
    def hardware(self) -> str | None:
        return self.study_fields.get("hardware")

    def with_evidence(
        self,
        *,
        verdicts: Mapping[str, Mapping[str, Any]],
        explanation: str | None,
        profile_errors: Mapping[str, str] | None = None,
    ) -> Recommendation:
        """A copy carrying the profiles' verdicts and the sentence that explains them."""
        return dataclasses.replace(
            self,
            verdicts={k: dict(v) for k, v in verdicts.items()},
            explanation=explanation,
            profile_errors=self.profile_errors if profile_errors is None else dict(profile_errors),
        )

    def with_time(self, time: Mapping[str, Any] | None) -> Recommendation:
        """A copy carrying the study's phase times (`tuner.store.phases.study_time`)."""
        return dataclasses.replace(self, time=None if time is None else dict(time))

    def with_search(self, search: Mapping[str, Any] | None) -> Recommendation:
        """A copy carrying the search's record (`search`)."""
        return dataclasses.replace(self, search=None if search is None else dict(search))

    def with_counts(self, counts: TrialCounts) -> Recommendation:
        return dataclasses.replace(self, trial_counts=counts)

    def to_dict(self) -> dict[str, Any]:
        """The JSON stored on the study and served by `best --json` and `/best`."""
        data: dict[str, Any] = {
            "study": self.study,
            "trial_counts": self.trial_counts.to_dict(),
            "gpu_seconds": self.gpu_seconds,
            "final_round": [e.to_dict() for e in self.final_round],
            "failures": dict(self.failures),
            "tie_rule": self.tie_rule,
            "tie_margin": self.tie_margin,
            "max_memory_bytes": self.max_memory_bytes,
            **{k: self.study_fields.get(k) for k in STUDY_FIELDS},
            "effective": self.effective,
            "note": self.note,
            "config": None if self.config is None else dict(self.config),
            "reason": self.reason,
        }
        if self.precision is not None:
            data["precision"] = self.precision
            data["reference_precision"] = self.study_fields.get("precision")
        if self.pareto is not None:
            data["pareto"] = [e.to_dict() for e in self.pareto]
        if self.config is not None:
            data |= {
                "source": self.source,
                "throughput": None
                if self.throughput is None
                else (self.throughput.to_dict() | {"unit": "samples/s"}),
                "step_ms": self.step_ms,
                "peak_memory_bytes": self.peak_memory_bytes,
                "device_memory_bytes": self.device_memory_bytes,
                "headroom_bytes": self.headroom_bytes,
                "utilisation": None if self.utilisation is None else dict(self.utilisation),
                "speedup": {k: v.to_dict() for k, v in self.speedup.items()},
                "ties": [e.to_dict() for e in self.ties],
                "was_tie": self.was_tie,
                "floor": None if self.floor is None else dataclasses.asdict(self.floor),
                "parity": None if self.parity is None else dict(self.parity),
                "setup_s": self.setup_s,
                "break_even_steps": dict(self.break_even_steps),
                "train_steps": self.train_steps,
            }
        if self.verdicts is not None:
            data["verdicts"] = {k: dict(v) for k, v in self.verdicts.items()}
        if self.verdicts is not None or self.explanation is not None:
            data["explanation"] = self.explanation
        if self.profile_errors is not None:
            data["profile_errors"] = dict(self.profile_errors)
        if self.time is not None:
            data["time"] = dict(self.time)
        if self.search is not None:
            data["search"] = dict(self.search)
        return json_safe_dict(data)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Recommendation:
        """Read a stored recommendation (of this version or an earlier one)."""

        def entries(key: str) -> tuple[Entry, ...]:
            return tuple(Entry.from_dict(e) for e in data.get(key) or ())

        throughput = data.get("throughput")
        floor = data.get("floor")
        # `n_trials`: the key until 2026-11-27 (a count by state, never a number).
        counts = data.get("trial_counts") or data.get("n_trials") or {}
        fields = {k: data.get(k) for k in STUDY_FIELDS}
        chosen = None
        if "reference_precision" in data:
            # `precision` is then the chosen one; the study's is `reference_precision`.
            chosen = data.get("precision")
            fields["precision"] = data["reference_precision"]
        return cls(
            study=data["study"],
            config=None if data.get("config") is None else dict(data["config"]),
            reason=data.get("reason"),
            trial_counts=TrialCounts.from_dict(counts),
            gpu_seconds=float(data.get("gpu_seconds") or 0.0),
            final_round=entries("final_round"),
            failures=dict(data.get("failures") or {}),
            tie_rule=data.get("tie_rule"),
            tie_margin=data.get("tie_margin"),
            max_memory_bytes=data.get("max_memory_bytes"),
            study_fields=fields,
            precision=chosen,
            effective=bool(data.get("effective", True)),
            note=data.get("note"),
            pareto=None if data.get("pareto") is None else entries("pareto"),
            source=data.get("source"),
            throughput=None if not throughput else Interval.from_dict(throughput),
            step_ms=data.get("step_ms"),
            peak_memory_bytes=data.get("peak_memory_bytes"),
            utilisation=None if data.get("utilisation") is None else dict(data["utilisation"]),
            device_memory_bytes=data.get("device_memory_bytes"),
            speedup={k: Interval.from_dict(v) for k, v in (data.get("speedup") or {}).items()},
            ties=entries("ties"),
            was_tie=data.get("was_tie"),
            floor=None
            if not floor
            else Floor(step_ms=float(floor["step_ms"]), ratio=float(floor["ratio"])),
            parity=None if data.get("parity") is None else dict(data["parity"]),
            setup_s=data.get("setup_s"),
            break_even_steps=dict(data.get("break_even_steps") or {}),
            train_steps=data.get("train_steps"),
            verdicts=None
            if data.get("verdicts") is None
            else {k: dict(v) for k, v in data["verdicts"].items()},
            explanation=data.get("explanation"),
            profile_errors=None
            if data.get("profile_errors") is None
            else dict(data["profile_errors"]),
            time=None if data.get("time") is None else dict(data["time"]),
            search=None if data.get("search") is None else dict(data["search"]),
        )


def utilisation_text(use: Mapping[str, Any] | None) -> str | None:
    """'412.3 TFLOP/s, 41.7 % MFU (against the H100 SXM dense bf16 peak, 989 TFLOP/s)', with
    '; recomputes 11.2 % more FLOPs' for a checkpointing config; the reason where there is no
    MFU; None without a FLOP count."""
    if not use or use.get("tflops") is None:
        return None
    rate = f"{use['tflops']:.1f} TFLOP/s"
    again = use.get("recompute_share")
    # Checkpointing's recomputation is compute the step does that MFU does not count.
    extra = f"; recomputes {100 * again:.1f} % more FLOPs" if again else ""
    if use.get("mfu") is None:
        return f"{rate}; no MFU: {use.get('note')}{extra}"
    return f"{rate}, {100 * use['mfu']:.1f} % MFU ({use.get('note')}){extra}"


def memory_text(peak: int | None, total: int | None) -> str | None:
    """'55.8 GB of 79.1 GB (23.3 GB headroom)'; the peak alone without the device's total."""
    if peak is None:
        return None
    if total is None:
        return _size(peak)
    return f"{_size(peak)} of {_size(total)} ({_size(total - peak)} headroom)"


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:,.1f} MiB"


def recommends(stored: Mapping[str, Any] | None) -> bool:
    """Whether a stored recommendation (`Recommendation.to_dict`, or None) recommends a config:
    one that recommends none is stored too, with the reason and each failure, but there is
    nothing to train with (the API's `has_recommendation`, its `best` a 409)."""
    return stored is not None and stored.get("config") is not None
