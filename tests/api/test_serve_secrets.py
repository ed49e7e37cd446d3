"""A real `python -m tuner serve` given a PostgreSQL URL with a password (issue 56): no process
of it shows the password in its arguments (what `ps -ef` shows every user of the host), no
line it logs shows it, and without tokens it says at start-up that the API is open to anyone on
this host. The server trusts local connections, so the password is carried, never checked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.api.helpers import SMALL, clean_env, env_of, free_port, wait_for

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

SECRET = "s3cret-Pa55-56"


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def arguments(pid: int) -> str:
    return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()


def test_serve_keeps_the_password_off_every_command_line_and_log_and_says_it_is_open(
    tmp_path: Path, pg_url: str
) -> None:
    url = pg_url.replace("postgres@", f"postgres:{SECRET}@", 1)
    port = free_port()
    log = tmp_path / "serve.log"
    env = clean_env() | env_of(SMALL | {"torch_threads": 1})
    command = [sys.executable, "-m", "tuner", "serve", "--port", str(port), "--workers", "1"]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*command, "--storage", url],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def ready() -> bool:
            assert proc.poll() is None, log.read_text()
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).json()
            except httpx.TransportError:
                return False
            return bool(health["workers_alive"] >= 1)

        wait_for(ready, timeout_s=120, what="the server and its worker", every_s=0.3)
        workers = children_of(proc.pid)
        assert workers, "serve started no worker process"
        for pid in [proc.pid, *workers]:
            shown = arguments(pid)
            assert SECRET not in shown and "--storage" not in shown, shown
        # The worker got it through its environment (readable by its own user alone).
        environ = (Path("/proc") / str(workers[0]) / "environ").read_bytes().split(b"\0")
        assert f"TUNER_STORAGE={url}".encode() in environ
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    text = log.read_text()
    assert SECRET not in text
    assert "postgres:***@127.0.0.1:5432/test" in text
    assert f"no TUNER_API_TOKENS: the API on 127.0.0.1:{port} is open to anyone on this host" in (
        text
    )
