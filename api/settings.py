"""The service's settings, from `TUNER_*` environment variables (pydantic-settings).

`TUNER_STORAGE` (the database of the jobs and the Optuna studies), `TUNER_API_TOKENS` (comma
separated bearer tokens, each `NAME:TOKEN` or a bare token; none: no authentication, which `serve`
allows on a loopback host only), `TUNER_API_ADMIN_TOKENS` (the same, for tokens that see and
cancel every job), `TUNER_WORKERS` (worker processes `serve` starts; default one per visible GPU,
or one on the CPU), `TUNER_WORKLOADS` (plug-in workloads, JSON `{name: "package.module:factory"}`),
`TUNER_METRICS_PORT` and `TUNER_METRICS_HOST` (an unauthenticated scrape port of every job's
metrics, off by default), and the limits. The workers' own settings (protocol, heartbeats) are
`tuner.service.settings.WorkerSettings`; both share `tuner.service.settings.ServiceSettings`.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import NoDecode

from tuner.service.owners import Owner, owner_of
from tuner.service.settings import ServiceSettings

MIN_TOKEN_LENGTH = 16
TOKEN_NAME = re.compile(r"[A-Za-z0-9_.@-]{1,64}")
BODY_TIMEOUT_S = 10.0

Tokens = Annotated[tuple[SecretStr, ...], NoDecode]


@dataclasses.dataclass(frozen=True)
class Token:
    """A configured bearer token and whom it stands for (its name, never the token, is shown)."""

    secret: bytes
    owner: Owner


def split_entry(entry: str) -> tuple[str | None, str]:
    """`NAME:TOKEN` as (NAME, TOKEN); a bare token (no `:`, or before it no valid name) as
    (None, TOKEN)."""
    name, sep, secret = entry.partition(":")
    if sep and TOKEN_NAME.fullmatch(name):
        return name, secret
    return None, entry


class ApiSettings(ServiceSettings):
    """`serve`'s settings: tokens, how many workers, the API's limits (and the shared ones)."""

    api_tokens: Tokens = ()
    api_admin_tokens: Tokens = ()
    workers: int | None = Field(default=None, ge=0, le=256)
    max_queued_per_token: int = Field(default=20, ge=1, le=100_000)
    max_body_bytes: int = Field(default=64 * 1024, ge=1_024, le=16 * 1024 * 1024)
    body_timeout_s: float = Field(
        default=BODY_TIMEOUT_S,
        allow_inf_nan=False,
        gt=0,
        le=3_600,
        description="a request's body must have arrived this many seconds after it started",
    )
    access_log: bool = True
    # The operator's opt-in scrape port: /metrics of every job, without a token, on its own
    # port (none by default: on the API's port an owner's token sees its own counts only, an
    # admin token all). Bind it where only the scraper reaches it.
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    metrics_host: str = "127.0.0.1"

    @field_validator("api_tokens", "api_admin_tokens", mode="before")
    @classmethod
    def _split_tokens(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [part.strip() for part in value.split(",") if part.strip()]
        return value

    @field_validator("api_tokens", "api_admin_tokens")
    @classmethod
    def _long_enough(cls, value: tuple[SecretStr, ...]) -> tuple[SecretStr, ...]:
        for entry in value:
            name, secret = split_entry(entry.get_secret_value())
            if name is None and ":" in secret:
                # Read as a bare token, `bad name!:TOKEN` answered only to itself whole, and
                # the operator who meant NAME:TOKEN was told nothing.
                said = secret.partition(":")[0]
                raise ValueError(
                    f"an entry NAME:TOKEN needs a NAME of 1-64 letters, digits and _.@-, not "
                    f"{said!r} (a bare token has no ':')"
                )
            if len(secret) < MIN_TOKEN_LENGTH:
                raise ValueError(
                    f"each token needs at least {MIN_TOKEN_LENGTH} characters "
                    "(an entry is TOKEN or NAME:TOKEN, NAME of letters, digits and _.@-)"
                )
        return value

    @model_validator(mode="after")
    def _distinct(self) -> ApiSettings:
        tokens = self.tokens()
        for label, values in (
            ("token", [t.secret for t in tokens]),
            ("name", [t.owner.name for t in tokens]),
        ):
            if len(set(values)) != len(values):
                raise ValueError(
                    f"TUNER_API_TOKENS, TUNER_API_ADMIN_TOKENS: a {label} is given twice (each "
                    "token and "
                    "each name once, across both)"
                )
        return self

    def tokens(self) -> tuple[Token, ...]:
        """Every configured token with its owner: its name (a named one's jobs stored before it
        had a name are under its hash: those are its jobs too), and whether it is an admin's."""
        found = []
        for entries, admin in ((self.api_tokens, False), (self.api_admin_tokens, True)):
            for entry in entries:
                name, secret = split_entry(entry.get_secret_value())
                hashed = owner_of(secret)
                owner = Owner(name=name or hashed, names=(hashed,), admin=admin)
                found.append(Token(secret=secret.encode("utf-8"), owner=owner))
        return tuple(found)

    def token_bytes(self) -> tuple[bytes, ...]:
        return tuple(t.secret for t in self.tokens())
