"""The service's settings, from `TUNER_*` environment variables (pydantic-settings).

`TUNER_STORAGE` (the database of the jobs and the Optuna studies), `TUNER_API_TOKENS` (comma
separated bearer tokens; none: no authentication, which `serve` allows on a loopback host only),
`TUNER_WORKERS` (worker processes `serve` starts; default one per visible GPU, or one on the CPU),
`TUNER_WORKLOADS` (plug-in workloads, JSON `{name: "package.module:factory"}`), and the limits.
The workers' own settings (protocol, heartbeats) are `tuner.service.settings.WorkerSettings`;
both share `tuner.service.settings.ServiceSettings`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import NoDecode

from tuner.service.settings import ServiceSettings

MIN_TOKEN_LENGTH = 16


class ApiSettings(ServiceSettings):
    """`serve`'s settings: tokens, how many workers, the API's limits (and the shared ones)."""

    api_tokens: Annotated[tuple[SecretStr, ...], NoDecode] = ()
    workers: int | None = Field(default=None, ge=0, le=256)
    max_queued_per_token: int = Field(default=20, ge=1, le=100_000)
    max_body_bytes: int = Field(default=64 * 1024, ge=1_024, le=16 * 1024 * 1024)
    access_log: bool = True

    @field_validator("api_tokens", mode="before")
    @classmethod
    def _split_tokens(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("api_tokens")
    @classmethod
    def _long_enough(cls, value: tuple[SecretStr, ...]) -> tuple[SecretStr, ...]:
        for token in value:
            if len(token.get_secret_value()) < MIN_TOKEN_LENGTH:
                raise ValueError(f"each token needs at least {MIN_TOKEN_LENGTH} characters")
        return value

    def token_bytes(self) -> tuple[bytes, ...]:
        return tuple(t.get_secret_value().encode("utf-8") for t in self.api_tokens)
