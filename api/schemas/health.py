"""The health check."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field


class HealthOut(BaseModel):
    status: Literal["ok", "no_workers", "database_unreachable"]
    database: bool = Field(description="the database answered")
    workers_alive: int = Field(description="workers that heartbeat within the lease")
