"""Who owns a job: the name of the token that submitted it.

A job's row stores its owner's name (`JobRow.owner`); a token sees and cancels only the jobs
stored under its names, and another token's job is, to it, a job that does not exist. Admin
tokens see everything. Tokens are named by the operator (`TUNER_API_TOKENS=alice:<token>,...`),
so that the row and the logs show a name, never the token; an unnamed token's name is a hash of
it (`owner_of`), which is also what jobs were stored under before tokens had names.
"""

from __future__ import annotations

import dataclasses
import hashlib

ANONYMOUS = "anonymous"


def owner_of(token: str | None) -> str:
    """A stable, non-reversible id of a bearer token (an unnamed token's name)."""
    if not token:
        return ANONYMOUS
    return hashlib.sha256(token.encode("utf-8")).hexdigest()[:32]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Owner:
    """A caller of the service.

    name: what its new jobs are stored under (and what the logs show).
    names: every name its jobs may be stored under: `name`, and for a named token the hash its
        jobs were stored under before it had a name.
    admin: sees and cancels every job (an admin token, or a service without tokens).
    """

    name: str
    names: tuple[str, ...] = ()
    admin: bool = False

    def __post_init__(self) -> None:
        if self.name not in self.names:
            object.__setattr__(self, "names", (self.name, *self.names))

    def owns(self, owner: str) -> bool:
        return self.admin or owner in self.names


EVERYONE = Owner(name=ANONYMOUS, admin=True)
"""The caller of a service without tokens (on loopback only): it sees every job, as before."""
