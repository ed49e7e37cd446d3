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

Compressed bodies: `Content-Encoding: gzip` (or `x-gzip`, `deflate`) is decoded here, and the
decoded body is held to the same limit, so a small bomb is a 413 too; a body that is not what its
header says is a 400, and an encoding not listed a 415 naming those that are. Before, a gzip body
reached the JSON parser as bytes ("not valid UTF-8") and a `br` one was read as plain text.
"""

from __future__ import annotations

import json
import zlib

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# zlib's window bits for each coding a body may come in: gzip's header, or zlib's (deflate).
DECODERS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}
ENCODINGS = ", ".join(["identity", *DECODERS])


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
        codings = _codings(scope)
        if codings and body:  # an empty body (a cancel's POST) has nothing to decode
            decoded = await self._decode(body, codings, send)
            if decoded is None:
                return  # refused
            body = decoded
            scope = dict(scope)  # the route sees a plain body, and its true length
            scope["headers"] = [
                (name, value)
                for name, value in scope["headers"]
                if name not in (b"content-encoding", b"content-length")
            ] + [(b"content-length", str(len(body)).encode())]
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

    async def _decode(self, body: bytes, codings: list[str], send: Send) -> bytes | None:
        """`body` with `codings` undone (the last applied first); None after refusing it."""
        unknown = [coding for coding in codings if coding not in DECODERS]
        if unknown:
            why = f"in Content-Encoding {unknown[0]!r}, which is not read here (send {ENCODINGS})"
            await self._refuse(send, 415, why)
            return None
        for coding in reversed(codings):
            decoder = zlib.decompressobj(DECODERS[coding])
            try:
                # One byte past the limit is enough to refuse: a bomb is never inflated whole.
                body = decoder.decompress(body, self.max_bytes + 1)
            except zlib.error as error:
                await self._refuse(send, 400, f"not valid {coding} ({error})")
                return None
            if len(body) > self.max_bytes:
                why = f"over the limit of {self.max_bytes} bytes once decoded ({coding})"
                await self._refuse(send, 413, why)
                return None
            if not decoder.eof or decoder.unused_data:
                where = "ends early" if not decoder.eof else "has bytes after its end"
                await self._refuse(send, 400, f"not valid {coding} (it {where})")
                return None
        return body

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


def _codings(scope: Scope) -> list[str]:
    """The codings of `Content-Encoding`, in the order applied, without `identity`."""
    values = [value for name, value in scope["headers"] if name == b"content-encoding"]
    codings = [
        part.strip().lower() for value in values for part in value.decode("latin-1").split(",")
    ]
    return [coding for coding in codings if coding and coding != "identity"]
