"""Dependencies of the routes, as `Annotated` aliases: the services and the caller."""

from __future__ import annotations

import dataclasses
import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.settings import ApiSettings, Token
from tuner.evidence.reader import StudyReader
from tuner.service.owners import EVERYONE, Owner
from tuner.service.reports import ReportCache
from tuner.service.spec import WorkloadRegistry
from tuner.service.submissions import Submissions


@dataclasses.dataclass(frozen=True)
class Services:
    """What the app holds for its lifetime (on `app.state.services`)."""

    settings: ApiSettings
    store: Submissions
    reader: StudyReader
    registry: WorkloadRegistry
    tokens: tuple[Token, ...]
    reports: ReportCache


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


def get_reports(services: ServicesDep) -> ReportCache:
    return services.reports


SettingsDep = Annotated[ApiSettings, Depends(get_settings)]
StoreDep = Annotated[Submissions, Depends(get_store)]
ReaderDep = Annotated[StudyReader, Depends(get_reader)]
RegistryDep = Annotated[WorkloadRegistry, Depends(get_registry)]
ReportsDep = Annotated[ReportCache, Depends(get_reports)]

bearer = HTTPBearer(auto_error=False, description="a token of TUNER_API_TOKENS")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def authenticate(services: ServicesDep, credentials: Credentials) -> Owner:
    """The caller, from `Authorization: Bearer <token>`; 401 unless the token is configured.

    Every configured token is compared, each in constant time and none skipped after a match, so
    the time taken tells nothing about which one (or how much of one) matched. No tokens
    configured: no authentication, and the caller sees every job.
    """
    if not services.tokens:
        return EVERYONE
    given = b"" if credentials is None else credentials.credentials.encode("utf-8", "replace")
    found: Owner | None = None
    for token in services.tokens:
        if hmac.compare_digest(given, token.secret):
            found = token.owner
    if credentials is None or found is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            "missing or invalid bearer token (send Authorization: Bearer <token>)",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return found


CallerDep = Annotated[Owner, Depends(authenticate)]
