"""Request bodies over the limit get 413, and bodies slower than the deadline 408, before any
route (or JSON parser) sees them.

A pure ASGI middleware: a `Content-Length` over the limit is refused at once; a body without one
(chunked) is read up to the limit and refused as soon as it passes it. Accepted bodies (at most
the limit, 64 KiB by default) are handed on from memory.

Slow clients: the whole body must have arrived `timeout_s` (`TUNER_BODY_TIMEOUT_S`, 10 s by
default) after the request reached the app; a client that trickles it (say, a byte a second) is
answered 408 and its connection closed then, so that it holds neither a connection nor a worker
thread for longer. Headers are uvicorn's to read: a client slow to send those is left to a proxy
in front (docker/README.md puts one there for TLS anyway).
"""

from __future__ import annotations

import json

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyLimit:
    def __init__(self, app: ASGIApp, *, max_bytes: int, timeout_s: float) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await self._refuse(send, 413, f"over the limit of {self.max_bytes} bytes")
            return
        body: bytes | None = None
        with anyio.move_on_after(self.timeout_s):
            body = await self._read(receive, send)
            if body is None:
                return  # refused, or the client went away
        if body is None:  # the deadline passed while the body was still arriving
            await self._refuse(send, 408, f"not complete within {self.timeout_s:g} s")
            return
        sent = False

        async def replay() -> Message:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _read(self, receive: Receive, send: Send) -> bytes | None:
        """The whole body; None after refusing it (over the limit) or a disconnect."""
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_bytes:
                await self._refuse(send, 413, f"over the limit of {self.max_bytes} bytes")
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _refuse(self, send: Send, status: int, why: str) -> None:
        payload = json.dumps({"detail": f"the request body is {why}"}).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})
