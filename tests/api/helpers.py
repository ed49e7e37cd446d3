"""Small real inputs for the service's tests: tokens, a tiny measurement protocol, polling."""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx

TOKEN = "test-token-aaaaaaaaaaaaaaaa"
OTHER_TOKEN = "test-token-bbbbbbbbbbbbbbbb"
ADMIN_TOKEN = "test-token-adminadminadmin"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
OTHER_AUTH = {"Authorization": f"Bearer {OTHER_TOKEN}"}
ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN_TOKEN}"}

# The workers' settings for a run of about half a second per job phase (see tests/tuner/tiny.py).
SMALL: dict[str, Any] = {
    "measure_warmup": 1,
    "measure_windows": 3,
    "measure_window_steps": 2,
    "final_rounds": 1,
    "top_k": 2,
    "parity_steps": 4,
    "sampler": "random",
    "heartbeat_s": 0.2,
    "poll_s": 0.2,
    "lease_s": 60.0,
}
# A job's body that runs quickly on the CPU.
TINY_JOB: dict[str, Any] = {
    "workload": "mlp",
    "preset": "tiny",
    "trials": 3,
    "device": "cpu",
    "fix": {"num_workers": 0},
}

T = TypeVar("T")


def sqlite_url(directory: Path, name: str = "service.db") -> str:
    return f"sqlite:///{directory}/{name}"


def env_of(settings: dict[str, Any]) -> dict[str, str]:
    """`TUNER_*` variables for the given settings (for a server in a subprocess)."""
    return {f"TUNER_{k.upper()}": str(v) for k, v in settings.items()}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def wait_for(
    probe: Callable[[], T | None], *, timeout_s: float, what: str, every_s: float = 0.1
) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)


def clean_env() -> dict[str, str]:
    """This process's environment without any TUNER_* variable of the developer's shell, but
    with the tests' `TUNER_GATE_MEMO` (tests/conftest.py)."""
    return {
        k: v for k, v in os.environ.items() if not k.startswith("TUNER_") or k == "TUNER_GATE_MEMO"
    }


@contextlib.contextmanager
def served(app: Any) -> Iterator[int]:
    """`app` served by uvicorn on 127.0.0.1 in a thread of this process; yields its port."""
    import uvicorn  # here: the helpers above serve tests that start no server

    port = free_port()
    # Uvicorn closes a connection idle for 5 s; a client that reuses it at that moment reads a
    # closed socket (httpx.ReadError) and may not resend a POST. On a loaded CI machine a test
    # pauses that long between bursts, so the keep-alive here outlasts any test.
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", timeout_keep_alive=600
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    wait_for(lambda: server.started, timeout_s=30, what="uvicorn to start")
    try:
        yield port
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def shared_client(base_url: str, threads: int, **kwargs: Any) -> httpx.Client:
    """One client for `threads` threads at once, with a connection for each kept alive.

    Under httpx's default limits (20 kept alive) a thread returning a surplus connection can
    close one the pool has just handed to a waiting thread, whose request then reads a closed
    socket (httpx.ReadError, EBADF): encode/httpcore#1110, open for httpcore 1.0.9. A pool that
    never has a surplus never closes one, so a client-side failure here is the server's.
    """
    limits = httpx.Limits(max_connections=threads, max_keepalive_connections=threads)
    return httpx.Client(base_url=base_url, limits=limits, **kwargs)


def at_once(
    count: int,
    call: Callable[[], object],
    refused: type[BaseException] | tuple[type[BaseException], ...] = Exception,
) -> list[object]:
    """`call()` from `count` threads released together; what each returned, or the `refused`
    exception it raised (the call's result, asserted on by the test)."""
    start = threading.Barrier(count)
    results: list[object] = [None] * count

    def run(index: int) -> None:
        start.wait()
        try:
            results[index] = call()
        except refused as exc:
            results[index] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results
