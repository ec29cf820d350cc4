"""The ASGI lifespan half of the tests' small stand-in apps (execd's HTTP layer and the
slow-client guards run them): start-up completes at once, shut-down when asked."""

from __future__ import annotations

from typing import Any


async def answer_lifespan(receive: Any, send: Any) -> None:
    while (await receive())["type"] != "lifespan.shutdown":
        await send({"type": "lifespan.startup.complete"})
    await send({"type": "lifespan.shutdown.complete"})
