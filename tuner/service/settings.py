"""The service's settings, from `TUNER_*` environment variables (pydantic-settings): one class
per process kind (`WorkerSettings` here, `api.settings.ApiSettings` for the API), sharing
`ServiceSettings`, the fields both read.

`TUNER_STORAGE` (the database of the jobs and the Optuna studies), `TUNER_WORKLOADS` (plug-in
workloads, JSON `{name: "package.module:factory"}`), `TUNER_PROGRAMS` (the registry file of
training programs a job may name as `program:NAME`, trainers/program/runner.py), `TUNER_LEASE_S`
(heartbeat age after which a job's workers count as gone).
"""

from __future__ import annotations

import difflib
import os
import re
import sys
from typing import Literal, TypeVar

import pydantic
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict, SettingsError

from tuner.errors import TunerError
from tuner.search.measuring.measure import Protocol
from tuner.search.protocol import LIMITS
from tuner.store.storage import DEFAULT_STORAGE, normalise_url

S = TypeVar("S", bound=BaseSettings)


class ServiceSettings(BaseSettings):
    """What the API and the workers both read: the storage, the workloads, the lease."""

    model_config = SettingsConfigDict(env_prefix="TUNER_", extra="ignore")

    storage: str = DEFAULT_STORAGE
    programs: str | None = Field(
        default=None,
        description="registry file of training programs tuned as they are (trainers/program/)",
    )
    workloads: dict[str, str] = Field(
        default_factory=dict, description="plug-in workloads: JSON {name: package.module:factory}"
    )
    lease_s: float = Field(
        allow_inf_nan=False,
        default=60.0,
        gt=0,
        le=86_400,
        description="heartbeat age after which a job is requeued",
    )

    @pydantic.field_validator("storage")
    @classmethod
    def _storage(cls, value: str) -> str:
        return normalise_url(value)


class WorkerSettings(ServiceSettings):
    """`python -m tuner worker`: how it heartbeats, measures and retries."""

    heartbeat_s: float = Field(allow_inf_nan=False, default=5.0, gt=0, le=3_600)
    poll_s: float = Field(allow_inf_nan=False, default=2.0, gt=0, le=3_600)
    max_attempts: int = Field(
        default=3, ge=1, le=100, description="claims of one job before it fails"
    )
    measure_warmup: int = Field(default=10, ge=LIMITS["warmup"][0], le=LIMITS["warmup"][1])
    # As Protocol (one table): an interval needs two windows.
    measure_windows: int = Field(default=5, ge=LIMITS["windows"][0], le=LIMITS["windows"][1])
    measure_window_steps: int | None = Field(
        default=None,
        ge=LIMITS["window_steps"][0],
        le=LIMITS["window_steps"][1],
        description="steps per timed window; unset: 20, or 10 on the scale space (as `run`)",
    )
    final_rounds: int = Field(
        default=3, ge=1, le=100, description="unset: 3, and 1 for a CPU job (as `run`)"
    )
    top_k: int = Field(default=3, ge=1, le=100)
    parity_steps: int = Field(default=20, ge=2, le=100_000)
    precision_parity_steps: int | None = Field(
        default=None,
        ge=2,
        le=100_000,
        description="steps of the parity check of a config in another precision than the "
        "job's (a job with `precisions`); unset: parity_steps (as `run`)",
    )
    precision_tolerance: float | None = Field(
        allow_inf_nan=False,
        default=None,
        gt=0,
        le=1_000,
        description="how many times the reference's seed-to-seed envelope such a config may "
        "deviate by; unset: 3 (as `run`)",
    )
    baseline_every: int = Field(default=10, ge=1, le=100_000)
    profile: Literal["none", "baselines", "all"] = Field(
        default="baselines",
        description="what each job profiles: the baselines and the recommendation (as `run`), "
        "every trial too (all), or nothing (none); unset, a CPU job profiles none (as `run`)",
    )
    sampler: Literal["tpe", "random"] = "tpe"
    matmul_precision: Literal["highest", "high", "medium"] = Field(
        default="highest", description="torch float32 matmul precision of every job (high: TF32)"
    )
    torch_threads: int | None = Field(default=None, ge=1, le=1024)
    worker_nice: int = Field(
        default=0,
        ge=0,
        le=19,
        description=(
            "niceness of `python -m tuner worker` (e.g. 10: the API and the rest of the node go "
            "first when they want the CPU too)"
        ),
    )
    host: str | None = Field(
        default=None,
        min_length=1,
        max_length=255,
        description=(
            "the host name this worker reports (default: socket.gethostname()); GPU leases are "
            "keyed by the GPU's UUID, and by this host and the index only where torch has no UUID"
        ),
    )
    retry_base_s: float = Field(
        allow_inf_nan=False,
        default=0.5,
        gt=0,
        le=600,
        description="first wait after a database error",
    )
    retry_max_s: float = Field(
        allow_inf_nan=False,
        default=30.0,
        gt=0,
        le=3_600,
        description="longest wait between database retries",
    )
    parent_pid: int | None = Field(
        default=None, description="set by `serve`: shut down when it is gone"
    )

    def protocol(self) -> Protocol:
        return Protocol.given(
            warmup=self.measure_warmup,
            windows=self.measure_windows,
            window_steps=self.measure_window_steps,
        )


def load_settings(kind: type[S]) -> S:
    """The settings of `kind` from the environment; a bad variable is reported by its name (a
    JSON one that does not parse too: pydantic-settings' own error names neither the variable
    nor the cause)."""
    try:
        loaded = kind()
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        if not first["loc"]:
            # A check of several variables (`api.settings.ApiSettings._distinct`) names them
            # itself; its `loc` is empty (an IndexError here had hidden the message).
            raise TunerError(str(first["msg"]).removeprefix("Value error, ")) from exc
        said = str(first["msg"]).removeprefix("Value error, ")
        raise TunerError(f"TUNER_{str(first['loc'][0]).upper()}: {said}") from exc
    except SettingsError as exc:
        named = re.search(r'field "(\w+)"', str(exc))
        variable = f"TUNER_{named.group(1).upper()}" if named else "a TUNER_ variable"
        cause = exc.__cause__
        raise TunerError(
            f"{variable}: not valid JSON" + (f" ({cause})" if cause is not None else "")
        ) from exc
    if isinstance(loaded, WorkerSettings) and loaded.heartbeat_s * 2 > loaded.lease_s:
        # Workers take one whose heartbeat is older than the lease for dead: with a beat as slow
        # as the lease, healthy workers requeued each other's jobs until the job failed as
        # "lost 3 times" (a probe, 2026-12-08). Half the lease leaves room for one late beat.
        raise TunerError(
            f"TUNER_HEARTBEAT_S={loaded.heartbeat_s:g} with TUNER_LEASE_S={loaded.lease_s:g}: "
            f"allowed at most half the lease ({loaded.lease_s / 2:g}), else healthy workers "
            "are taken for dead"
        )
    warn_misspelt(kind)
    return loaded


def warn_misspelt(kind: type[BaseSettings]) -> list[str]:
    """One stderr line per `TUNER_*` variable that is no setting of `kind` but nearly spells one
    (`TUNER_STORGE`): pydantic-settings ignores it, and the process would run on the default
    without a word. Variables read elsewhere (the API's, `TUNER_CPU_STANDINS`) are far from
    every setting's name, so they pass unremarked. The lines, for the tests."""
    prefix = str(kind.model_config.get("env_prefix", "")).upper()
    names = [name.upper() for name in kind.model_fields]
    said = []
    for variable in sorted(os.environ):
        if not variable.startswith(prefix) or variable[len(prefix) :] in names:
            continue
        close = difflib.get_close_matches(variable[len(prefix) :], names, n=1, cutoff=0.8)
        if close:
            said.append(
                f"warning: {variable} is not a setting here and is ignored; "
                f"did you mean {prefix}{close[0]}?"
            )
    for line in said:
        print(line, file=sys.stderr)
    return said
