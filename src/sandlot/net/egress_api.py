"""The egress runtime API (``egress-api.yaml``) of one sandbox, answered from the host side.

Clients reach a sandbox's port 18080 like any other port (direct endpoint or server proxy);
sandlot answers it itself instead of connecting into the sandbox, so nothing the workload
runs can impersonate or change it. ``/policy`` GET/PATCH/DELETE (and POST/PUT replacing the
policy, as the reference does) need the ``OPENSANDBOX-EGRESS-AUTH`` header the endpoint
resolver hands out; the credential-vault routes answer 501. HTTP/1.1 is spoken through h11
over the stream pair the endpoint machinery provides.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import h11

from sandlot.errors import SandlotError
from sandlot.net.policy import (
    EgressPolicy,
    PolicyError,
    TooManyRules,
    parse_policy,
    parse_rules,
    parse_targets,
)

log = logging.getLogger(__name__)
EGRESS_AUTH_HEADER = "OPENSANDBOX-EGRESS-AUTH"
MAX_BODY = 1 << 20


@dataclass
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()


def _json(status: int, payload: Any) -> Response:
    return Response(status, json.dumps(payload).encode())


def _text(status: int, message: str) -> Response:
    return Response(status, (message + "\n").encode(), "text/plain; charset=utf-8")


class PolicyAccess:
    """What the API needs of the server for one sandbox."""

    def __init__(
        self,
        token: str,
        current: Callable[[], EgressPolicy],
        change: Callable[[EgressPolicy], Awaitable[None]],
        enforcement_mode: str,
    ) -> None:
        self.token = token
        self.current = current
        self.change = change
        self.enforcement_mode = enforcement_mode

    def status(self, policy: EgressPolicy, with_policy: bool, reason: str | None = None
               ) -> Response:
        out: dict[str, Any] = {"status": "ok", "mode": policy.mode,
                               "enforcementMode": self.enforcement_mode}
        if reason:
            out["reason"] = reason
        if with_policy:
            out["policy"] = policy.to_json()
        return _json(200, out)


def _load(body: bytes) -> Any:
    text = body.decode(errors="replace").strip()
    if not text:
        raise PolicyError("empty body")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise PolicyError(f"the body is not JSON: {exc}") from None


async def handle(access: PolicyAccess, method: str, path: str, headers: dict[str, str],
                 body: bytes) -> Response:
    path = path.split("?", 1)[0].rstrip("/") or "/"
    if path == "/healthz":
        return _text(200, "ok")
    given = headers.get(EGRESS_AUTH_HEADER.lower(), "")
    if not hmac.compare_digest(given.encode(), access.token.encode()):
        return _text(401, "unauthorized")
    if path == "/credential-vault" or path.startswith("/credential-vault/"):
        return _text(501, "the credential vault is not supported by sandlot yet")
    if path != "/policy":
        return _text(404, "not found")
    # The reference's wording per method for a bad body (its text/plain 400 answers).
    invalid = {"PATCH": "invalid patch rules", "DELETE": "invalid delete targets"}.get(
        method, "invalid policy")
    try:
        current = access.current()
        if method == "GET":
            return access.status(current, with_policy=True)
        if method in ("POST", "PUT"):
            if not body.strip():  # the reference resets to deny-all
                await access.change(EgressPolicy("deny"))
                return _json(200, {"status": "ok", "mode": "deny_all",
                                   "reason": "policy reset to default deny-all"})
            new = parse_policy(_load(body))
        elif method == "PATCH":
            rules = parse_rules(_load(body), "rules")
            if not rules:
                return _text(400, "invalid patch rules: empty array")
            new = current.patched(rules)
        elif method == "DELETE":
            new = current.without(parse_targets(_load(body)))
            if new == current:
                return access.status(current, False, "no matching targets found")
        else:
            return Response(405, b"method not allowed\n", "text/plain; charset=utf-8",
                            (("Allow", "GET, POST, PUT, PATCH, DELETE"),))
        await access.change(new)
        return access.status(new, with_policy=False)
    except TooManyRules as exc:
        return _text(413, exc.message)
    except PolicyError as exc:
        if exc.message == "empty body":
            return _text(400, "empty body")
        return _text(400, f"{invalid}: {exc.message}")
    except SandlotError as exc:  # e.g. 409 for a sandbox that is not running
        return _text(exc.status, exc.message)


async def serve(access: Callable[[], PolicyAccess | None], reader: asyncio.StreamReader,
                writer: asyncio.StreamWriter) -> None:
    """Answer HTTP/1.1 requests on one connection until the client closes it."""
    conn = h11.Connection(h11.SERVER)
    try:
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await reader.read(65536)
                conn.receive_data(data)
                continue
            if isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                if event is h11.PAUSED and conn.our_state is h11.DONE:
                    conn.start_next_cycle()
                    continue
                return
            if not isinstance(event, h11.Request):
                continue
            body = b""
            while True:
                ev = conn.next_event()
                if ev is h11.NEED_DATA:
                    conn.receive_data(await reader.read(65536))
                elif isinstance(ev, h11.Data):
                    body += ev.data
                    if len(body) > MAX_BODY:
                        raise h11.RemoteProtocolError("body too large")
                elif isinstance(ev, h11.EndOfMessage):
                    break
                elif isinstance(ev, h11.ConnectionClosed):
                    return
            hdrs = {k.decode().lower(): v.decode(errors="replace") for k, v in event.headers}
            acc = access()
            if acc is None:
                resp = _text(404, "sandbox not found")
            else:
                resp = await handle(acc, event.method.decode(), event.target.decode(), hdrs, body)
            writer.write(conn.send(h11.Response(status_code=resp.status, headers=[
                ("Content-Type", resp.content_type), ("Content-Length", str(len(resp.body))),
                *resp.headers])))
            writer.write(conn.send(h11.Data(data=resp.body)) + conn.send(h11.EndOfMessage()))
            await writer.drain()
            if conn.our_state is h11.MUST_CLOSE:
                return
            conn.start_next_cycle()
    except (h11.ProtocolError, OSError) as exc:
        log.debug("egress api connection ended: %s", exc)
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


async def open_socket(access: Callable[[], PolicyAccess | None]) -> socket.socket:
    """A connected, non-blocking socket whose far end is answered by ``serve``: what a
    connection to the sandbox's port 18080 is."""
    ours, theirs = socket.socketpair()
    ours.setblocking(False)
    task = asyncio.get_running_loop().create_task(_serve_socket(access, theirs))
    _tasks.add(task)
    task.add_done_callback(_tasks.discard)
    return ours


_tasks: set[asyncio.Task[None]] = set()


async def _serve_socket(access: Callable[[], PolicyAccess | None], sock: socket.socket) -> None:
    reader, writer = await asyncio.open_connection(sock=sock)
    await serve(access, reader, writer)
