"""A client that trickles its body cannot hold the server (issue 27): one that sends a byte a
second is answered 408 and cut off `TUNER_BODY_TIMEOUT_S` after its request reached the app,
long before its body is complete, and the server answers others meanwhile. Over a real socket
to uvicorn on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from api.settings import BODY_TIMEOUT_S, ApiSettings
from tests.api.conftest import make_app
from tests.api.helpers import AUTH, TOKEN, served

DEADLINE_S = 2.0
DECLARED = 400  # bytes the client says it will send: 400 s at a byte a second


@pytest.fixture
def live(storage: str) -> Iterator[int]:
    app = make_app(storage, body_timeout_s=DEADLINE_S, access_log=False)
    with served(app) as port:
        yield port


def _trickle(port: int, answered: dict[str, object]) -> None:
    """POST a body of DECLARED bytes, one a second, until the server answers or closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(
            (
                "POST /v1/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                f"Authorization: Bearer {TOKEN}\r\nContent-Type: application/json\r\n"
                f"Content-Length: {DECLARED}\r\n\r\n"
            ).encode()
        )
        sock.settimeout(1.0)  # the pace: one byte, then up to a second listening
        sent, reply = 0, b""
        while sent < DECLARED:
            try:
                sock.sendall(b" ")
                sent += 1
                chunk = sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:  # reset by the server: cut off
                break
            if not chunk:
                break  # closed by the server
            reply += chunk
            if b"\r\n\r\n" in reply:
                break
        sock.settimeout(10)
        try:
            while chunk := sock.recv(4096):
                reply += chunk
        except OSError:
            pass
        answered.update(sent=sent, reply=reply)


def test_a_client_sending_a_byte_a_second_is_cut_off(live: int) -> None:
    answered: dict[str, object] = {}
    slow = threading.Thread(target=_trickle, args=(live, answered))
    slow.start()
    with httpx.Client(base_url=f"http://127.0.0.1:{live}", headers=AUTH, timeout=10) as http:
        time.sleep(0.5)  # the slow client is in the middle of its body now
        assert http.get("/healthz").status_code == 200  # others are served meanwhile
        assert http.get("/v1/jobs").status_code == 200
    slow.join(timeout=60)
    assert not slow.is_alive()
    reply = answered["reply"]
    assert isinstance(reply, bytes) and isinstance(answered["sent"], int)
    assert reply.startswith(b"HTTP/1.1 408 "), reply[:200]
    assert b"not complete within 2 s" in reply and b"connection: close" in reply.lower()
    assert answered["sent"] < DECLARED / 4  # cut off long before the body was complete


def test_the_deadline_is_a_setting_with_a_default() -> None:
    assert ApiSettings().body_timeout_s == BODY_TIMEOUT_S == 10.0
    assert ApiSettings(body_timeout_s=0.5).body_timeout_s == 0.5
