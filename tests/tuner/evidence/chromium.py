"""Open a local HTML page in headless Chromium and report what it rendered and logged.

Talks the DevTools protocol over `--remote-debugging-pipe` (fd 3: commands in, fd 4: replies and
events out, each message JSON ended by a NUL byte): no websocket, no extra package, and console
messages arrive with their real level. Used by the report's rendering test; the test skips when
Chromium is not installed (CI installs Debian's `chromium`).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

CHROMIUM = "/usr/bin/chromium"

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--mute-audio",
    "--no-default-browser-check",
    "--window-size=1280,900",
    "--remote-debugging-pipe",
)

# Per plot: the number of plotly SVG roots drawn inside it (0 = the plot did not render).
COUNT_PLOTS = """JSON.stringify(Array.from(document.querySelectorAll('div.plot')).map(
  d => [d.dataset.plot, d.querySelectorAll('.main-svg').length,
        d.querySelectorAll('.main-svg .trace, .main-svg .bars, .main-svg .boxlayer .trace,'
                           + ' .main-svg .scatterlayer .trace').length]))"""


@dataclasses.dataclass
class Rendered:
    plots: dict[str, int]
    """data-plot name -> plotly SVG roots drawn in it."""
    traces: dict[str, int]
    """data-plot name -> drawn trace groups in it."""
    errors: list[str]
    """Uncaught exceptions, console.error/assert calls and browser log entries of level error."""
    requests: list[str]
    """Every URL the page asked for (its own file included)."""
    screenshot: bytes | None


def available() -> bool:
    return Path(CHROMIUM).exists() or shutil.which("chromium") is not None


class _Pipe:
    def __init__(self, proc: subprocess.Popen[bytes], write_fd: int, read_fd: int) -> None:
        self.proc = proc
        self.write_fd = write_fd
        self.read_fd = read_fd
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def send(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
        timeout: float = 30.0,
    ) -> dict[str, Any]:
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self.write_fd, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            for reply in self._read(deadline):
                if reply.get("id") == self.next_id:
                    if "error" in reply:
                        raise RuntimeError(f"{method}: {reply['error']}")
                    return dict(reply.get("result", {}))
                self.events.append(reply)

    def wait_event(self, method: str, timeout: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        seen = len(self.events)
        while True:
            for event in self.events[seen:]:
                if event.get("method") == method:
                    return event
            seen = len(self.events)
            try:
                self.events.extend(self._read(deadline))
            except TimeoutError:
                return None

    def _read(self, deadline: float) -> list[dict[str, Any]]:
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer from Chromium")
            ready, _, _ = select.select([self.read_fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.read_fd, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium closed its pipe (exit {self.proc.poll()})")
            self.buffer += chunk
        *messages, self.buffer = self.buffer.split(b"\0")
        return [json.loads(m) for m in messages if m]


def _high_pipe() -> tuple[int, int]:
    """A pipe whose ends are above fd 4, so that moving them to 3 and 4 cannot clobber them."""
    low = os.pipe()
    high = tuple(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10) for fd in low)
    for fd in low:
        os.close(fd)
    return high[0], high[1]


def render(
    page: Path, profile_dir: Path, *, budget_s: float = 20.0, screenshot: bool = False
) -> Rendered:
    """Load `page` (a local file) and wait until every `div.plot` has drawn, or `budget_s`."""
    commands_r, commands_w = _high_pipe()
    replies_r, replies_w = _high_pipe()
    binary = CHROMIUM if Path(CHROMIUM).exists() else str(shutil.which("chromium"))
    args = [*FLAGS, f"--user-data-dir={profile_dir}", "about:blank"]
    # Chromium reads fd 3 and writes fd 4: put the pipe ends there in the child.
    script = f'exec "$0" "$@" 3<&{commands_r} 4>&{replies_w} {commands_r}<&- {replies_w}>&-'
    proc = subprocess.Popen(
        ["bash", "-c", script, binary, *args],
        pass_fds=(commands_r, replies_w),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    os.close(commands_r)
    os.close(replies_w)
    pipe = _Pipe(proc, commands_w, replies_r)
    try:
        target = pipe.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = pipe.send("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Runtime", "Log", "Page", "Network"):
            pipe.send(f"{domain}.enable", session=session)
        pipe.send("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
        pipe.wait_event("Page.loadEventFired", timeout=budget_s)
        deadline = time.monotonic() + budget_s
        counts: list[list[Any]] = []
        while time.monotonic() < deadline:
            value = pipe.send(
                "Runtime.evaluate",
                {"expression": COUNT_PLOTS, "returnByValue": True},
                session=session,
            )
            counts = json.loads(value["result"]["value"])
            if counts and all(n > 0 for _, n, _ in counts):
                break
            time.sleep(0.2)
        time.sleep(0.5)  # late errors (a plot's async draw) still arrive
        pipe.send("Runtime.evaluate", {"expression": "1"}, session=session)
        shot = None
        if screenshot:
            data = pipe.send(
                "Page.captureScreenshot",
                {"format": "png", "captureBeyondViewport": True},
                session=session,
            )
            shot = base64.b64decode(data["data"])
        errors, requests = _errors_and_requests(pipe.events)
        return Rendered(
            plots={name: n for name, n, _ in counts},
            traces={name: t for name, _, t in counts},
            errors=errors,
            requests=requests,
            screenshot=shot,
        )
    finally:
        with contextlib.suppress(RuntimeError, TimeoutError, OSError):
            pipe.send("Browser.close", timeout=5)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        os.close(commands_w)
        os.close(replies_r)
        if proc.stderr is not None:
            proc.stderr.close()


def _errors_and_requests(events: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    errors: list[str] = []
    requests: list[str] = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            text = details.get("exception", {}).get("description") or details.get("text")
            errors.append(f"uncaught: {text}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
            args = " ".join(
                str(a.get("value", a.get("description", ""))) for a in params.get("args", [])
            )
            errors.append(f"console.{params['type']}: {args}")
        elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
            entry = params["entry"]
            errors.append(
                f"log ({entry.get('source')}): {entry.get('text')} {entry.get('url', '')}"
            )
        elif method == "Network.requestWillBeSent":
            requests.append(str(params.get("request", {}).get("url", "")))
    return errors, requests
