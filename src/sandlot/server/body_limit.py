"""A size limit on lifecycle request bodies, as pure ASGI middleware.

Without it a client with the API key could make the server buffer and parse any amount of
JSON (200 MB were accepted). Bodies announced too large are refused (413) before they are
read; chunked ones are counted as they arrive and refused once over the limit. The server
proxy's bodies (file uploads into a sandbox) are streamed through, never buffered, and are
not limited here.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send

PROXY_SEGMENT = "/proxy/"
CODE = "PAYLOAD_TOO_LARGE"


class BodyLimitMiddleware:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _message(self) -> str:
        return f"request body larger than {self.max_bytes} bytes ([server] max_request_body_bytes)"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or PROXY_SEGMENT in scope["path"] or self.max_bytes <= 0:
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await self._refuse(send)
            return
        seen = 0
        refused = False

        async def counted() -> Message:
            nonlocal seen, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # Answer here, then tell the app the client left: it stops reading and
                    # whatever it would still send is dropped below.
                    refused = True
                    await self._refuse(send)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            if not refused:
                await send(message)

        await self.app(scope, counted, guarded_send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps({"code": CODE, "message": self._message()}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
