"""Shared models: the strict request base, error bodies, pages."""

from __future__ import annotations

import datetime as dt
import types
from typing import Annotated, Any, Union, get_args, get_origin, overload

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator


class Strict(BaseModel):
    """Request models: unknown fields are errors, no type is coerced into another, and every
    number is finite."""

    # NaN and infinities (JSON's `NaN`, `Infinity`, `1e999`) are refused as not finite.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _null_is_left_out(cls, value: Any, info: ValidationInfo) -> Any:
        # `"trials": null` had met pydantic's "Input should be a valid integer" (a probe,
        # 2026-12-07): a field with a default that null is not says how to get that default.
        field = cls.model_fields.get(info.field_name or "")
        if (
            value is None
            and field is not None
            and not field.is_required()
            and not _admits_none(field.annotation)
        ):
            raise ValueError("null is not a value of this field: leave it out for its default")
        return value


def _admits_none(annotation: Any) -> bool:
    if annotation is None or annotation is type(None) or annotation is Any:
        return True
    origin = get_origin(annotation)
    if origin is Annotated:
        return _admits_none(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return any(_admits_none(arg) for arg in get_args(annotation))
    return False


class ErrorOut(BaseModel):
    detail: str = Field(description="what was wrong, in one sentence")


class Recommendation(BaseModel):
    """The tuner's recommendation JSON (`python -m tuner best --json`), as stored on the study."""

    model_config = ConfigDict(extra="allow")

    study: str
    config: dict[str, Any] | None = Field(
        description="the recommended LoopConfig; null: none passed (see reason)"
    )
    reason: str | None = None
    workload: str | None = None
    preset: str | None = None
    hardware: str | None = None
    fingerprint: dict[str, Any] | None = None
    throughput: dict[str, Any] | None = None
    speedup: dict[str, Any] | None = None
    ties: list[dict[str, Any]] | None = None
    trial_counts: dict[str, int] | None = Field(
        default=None, description="trials by state: complete, failed, pruned, interrupted, ..."
    )
    gpu_seconds: float | None = None
    floor: dict[str, Any] | None = None
    peak_memory_bytes: int | None = None
    headroom_bytes: int | None = Field(
        default=None, description="device memory the recommended config leaves unused at its peak"
    )
    utilisation: dict[str, Any] | None = Field(
        default=None,
        description="model FLOPs of the recommended step: tflops, mfu (0..1; null on a CPU or "
        "an unknown GPU), peak_tflops, a note saying what the MFU is counted against, and "
        "recompute_share (FLOPs its activation checkpointing computes again, a share of the "
        "model's; not in the MFU)",
    )
    verdicts: dict[str, Any] | None = Field(
        default=None,
        description="profiled config (baselines, recommended) -> kind, "
        "explanation and the profile figures behind it",
    )
    explanation: str | None = Field(
        default=None,
        description="one line: what bounded the baseline, what the recommended "
        "config changed, its speedup",
    )
    profile_errors: dict[str, str] | None = None


class BestSoFar(BaseModel):
    trial: int
    throughput: float | None = Field(description="samples/s: median of the pooled windows")
    ci95: list[float | None] | None = None
    config: dict[str, Any] | None = None


@overload
def utc(value: dt.datetime) -> dt.datetime: ...
@overload
def utc(value: None) -> None: ...
@overload
def utc(value: dt.datetime | None) -> dt.datetime | None: ...


def utc(value: dt.datetime | None) -> dt.datetime | None:
    """Stored timestamps are naive UTC; the API shows them with their offset."""
    if value is None or value.tzinfo is not None:
        return value
    return value.replace(tzinfo=dt.UTC)
