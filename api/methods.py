"""HEAD answered wherever GET is, and a 405's `Allow` naming every method of its path.

FastAPI's routes take only the methods they declare, so `HEAD /v1/jobs/{id}` was 405 while GET
answered: HTTP has a server that answers GET answer HEAD too (RFC 9110, 9.3.2), and monitors,
proxies and `curl -I` send it. Here a HEAD runs as the GET it stands for, with the GET's status
and headers (its `Content-Length` and `ETag` included) and no body.

Starlette's 405 names in `Allow` the methods of the first route that matched the path alone:
`HEAD /v1/jobs` said `Allow: POST` though GET answers there too. Here it names the methods of
every route of that path.
"""

from __future__ import annotations

from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class Methods:
    def __init__(self, app: ASGIApp, *, routes: list[BaseRoute]) -> None:
        self.app = app
        self.routes = routes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        head = scope["method"] == "HEAD"
        if head:
            scope = dict(scope, method="GET")

        async def reply(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 405:
                message = dict(message, headers=self._allow(scope, message["headers"]))
            elif head and message["type"] == "http.response.body":
                if message.get("more_body", False):
                    return  # a HEAD sends the GET's headers only: its body parts are dropped
                message = dict(message, body=b"")
            await send(message)

        await self.app(scope, receive, reply)

    def _allow(self, scope: Scope, headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        methods: set[str] = set()
        for route in self.routes:
            match, _ = route.matches(dict(scope, method=""))
            # PARTIAL: the path matched and the method did not (FULL: a route without methods).
            if match != Match.NONE:
                methods |= set(getattr(route, "methods", None) or ())
        if not methods:
            return headers
        if "GET" in methods:
            methods.add("HEAD")
        kept = [(k, v) for k, v in headers if k.lower() != b"allow"]
        return [*kept, (b"allow", ", ".join(sorted(methods)).encode())]
