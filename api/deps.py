"""Dependencies of the routes, as `Annotated` aliases: the services and the caller."""

from __future__ import annotations

import dataclasses
import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.settings import ApiSettings
from tuner.evidence.reader import StudyReader
from tuner.service.spec import WorkloadRegistry, owner_of
from tuner.service.submissions import Submissions


@dataclasses.dataclass(frozen=True)
class Services:
    """What the app holds for its lifetime (on `app.state.services`)."""

    settings: ApiSettings
    store: Submissions
    reader: StudyReader
    registry: WorkloadRegistry
    tokens: tuple[bytes, ...]


@dataclasses.dataclass(frozen=True)
class Caller:
    owner: str  # a hash of the token (tuner.service.spec.owner_of)


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def get_settings(services: ServicesDep) -> ApiSettings:
    return services.settings


def get_store(services: ServicesDep) -> Submissions:
    return services.store


def get_reader(services: ServicesDep) -> StudyReader:
    return services.reader


def get_registry(services: ServicesDep) -> WorkloadRegistry:
    return services.registry


SettingsDep = Annotated[ApiSettings, Depends(get_settings)]
StoreDep = Annotated[Submissions, Depends(get_store)]
ReaderDep = Annotated[StudyReader, Depends(get_reader)]
RegistryDep = Annotated[WorkloadRegistry, Depends(get_registry)]

bearer = HTTPBearer(auto_error=False, description="a token of TUNER_API_TOKENS")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def authenticate(services: ServicesDep, credentials: Credentials) -> Caller:
    """The caller, from `Authorization: Bearer <token>`; 401 unless the token is configured.

    Every configured token is compared, each in constant time, so the time taken tells nothing
    about which one (or how much of one) matched. No tokens configured: no authentication.
    """
    if not services.tokens:
        return Caller(owner=owner_of(None))
    given = b"" if credentials is None else credentials.credentials.encode("utf-8")
    matched = False
    for token in services.tokens:
        matched |= hmac.compare_digest(given, token)
    if credentials is None or not matched:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing or invalid bearer token (send Authorization: Bearer <token>)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return Caller(owner=owner_of(credentials.credentials))


CallerDep = Annotated[Caller, Depends(authenticate)]
