"""`python -m tuner serve` (`python -m api`): the API under uvicorn, and the node's workers.

The workers are `tuner.service.pool.WorkerPool`'s child processes (one per visible GPU, or one on
the CPU, or `--workers N`, or none with `--no-worker`); on a normal stop `serve` stops them and
waits for them.
"""

from __future__ import annotations

import gc
import ipaddress
import logging
import signal
import threading

import uvicorn
from fastapi import FastAPI

from api.app import create_app, create_metrics_app
from api.settings import ApiSettings
from tuner.errors import TunerError
from tuner.service.pool import WorkerPool, default_slots
from tuner.service.settings import load_settings
from tuner.store.storage import masked, normalise_url

log = logging.getLogger("tuner.serve")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def check_exposure(host: str, settings: ApiSettings) -> None:
    """Refuse to serve beyond this machine without tokens: anyone could then run jobs."""
    if not settings.tokens() and not is_loopback(host):
        raise TunerError(
            f"--host: refusing to serve on {host!r} without TUNER_API_TOKENS: anyone who can "
            "reach the port could submit and cancel jobs. Set TUNER_API_TOKENS (comma separated "
            "bearer tokens) or serve on 127.0.0.1."
        )


def load_api_settings(storage: str | None = None) -> ApiSettings:
    """The settings (`storage` overrides TUNER_STORAGE); a bad variable is reported by name."""
    settings = load_settings(ApiSettings)
    if storage is None:
        return settings
    return settings.model_copy(update={"storage": normalise_url(storage)})


def serve(
    *, host: str, port: int, workers: int | None, no_worker: bool, storage: str | None
) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    settings = load_api_settings(storage=storage)
    check_exposure(host, settings)
    app = create_app(settings)  # a storage it cannot open is one line, and nothing more
    if not settings.tokens():
        # Allowed on a loopback address only (check_exposure), but every user of this machine
        # can then submit and cancel jobs: say so where the operator looks first.
        log.warning(
            "no TUNER_API_TOKENS: the API on %s:%d is open to anyone on this host (every local "
            "user can submit, read and cancel jobs); set TUNER_API_TOKENS=NAME:TOKEN to require "
            "a token",
            host,
            port,
        )
    log.info("storage %s", masked(settings.storage))
    if workers is None:
        workers = settings.workers
    pool = WorkerPool([] if no_worker else default_slots(workers), settings.storage)
    # uvicorn shuts down on SIGTERM/SIGINT, then raises the signal again under the handlers it
    # found: these, which end `serve` normally, so that the workers are stopped and waited for.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    scrape = _scrape_server(app, settings)
    pool.start()
    # Everything imported so far (torch, optuna: ~300k objects) lives as long as the process:
    # out of the collector's sight, a full collection takes microseconds instead of ~140 ms,
    # which would otherwise be a latency spike every few thousand requests.
    gc.collect()
    gc.freeze()
    try:
        uvicorn.run(app, host=host, port=port, access_log=settings.access_log, log_level="info")
    except _Stopping:
        pass
    finally:
        if scrape is not None:
            scrape.should_exit = True
        pool.stop()


def _scrape_server(app: FastAPI, settings: ApiSettings) -> uvicorn.Server | None:
    """The opt-in scrape port (`TUNER_METRICS_PORT`), served beside the API from a thread; None
    when the operator did not ask for one."""
    if settings.metrics_port is None:
        return None
    store = app.state.services.store
    server = uvicorn.Server(
        uvicorn.Config(
            create_metrics_app(store, lease_s=settings.lease_s),
            host=settings.metrics_host,
            port=settings.metrics_port,
            access_log=False,
            log_level="warning",
        )
    )
    threading.Thread(target=server.run, name="metrics", daemon=True).start()
    log.info(
        "metrics of every job on http://%s:%d/metrics", settings.metrics_host, settings.metrics_port
    )
    return server


class _Stopping(Exception):
    """SIGTERM or SIGINT reached `serve`."""


def _stop(signum: int, _frame: object) -> None:
    raise _Stopping(signum)
