"""Run a benchmark's client inside a network namespace without moving the run's own thread.

A thread made while its creator is in a namespace starts in that namespace and stays there.
The run's event loop thread moved into the namespace for a benchmark (and back) would leave
behind the default executor's workers it spawned meanwhile, still in the namespace; a later
benchmark's ``asyncio.to_thread(server.start)`` on such a worker starts its server where
nothing else can reach it (CI, 2026-12-04: ``observability``'s servers answered their own
health check and refused every other connection). So the client runs on a thread of its
own, with an event loop of its own whose workers end with it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from tests.net.testhosts import thread_in_netns

T = TypeVar("T")


async def run_in_netns(ns: str, body: Callable[[], Awaitable[T]]) -> T:
    """``await body()`` on a new thread in namespace ``ns``, with its own event loop.

    Cancelling the caller cancels ``body`` there and waits for its clean-up to finish."""
    outer = asyncio.get_running_loop()
    done: asyncio.Future[T] = outer.create_future()
    started = threading.Event()
    inner: dict[str, Any] = {}

    def settle(value: Any, error: BaseException | None) -> None:
        if done.done():
            return
        if error is None:
            done.set_result(value)
        else:
            done.set_exception(error)

    async def wrapped() -> T:
        inner["loop"], inner["task"] = asyncio.get_running_loop(), asyncio.current_task()
        started.set()
        return await body()

    def main() -> None:
        value: Any = None
        error: BaseException | None = None
        try:
            with thread_in_netns(ns), asyncio.Runner() as runner:
                value = runner.run(wrapped())
        except asyncio.CancelledError:
            error = RuntimeError(f"cancelled in namespace {ns}")
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's loop
            error = exc
        finally:
            started.set()
        with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody waits
            outer.call_soon_threadsafe(settle, value, error)

    thread = threading.Thread(target=main, name=f"bench-netns-{ns}", daemon=True)
    thread.start()
    try:
        return await asyncio.shield(done)
    except asyncio.CancelledError:
        done.cancel()  # nobody awaits it now: the thread's outcome is dropped, not logged
        await asyncio.to_thread(started.wait)
        if "task" in inner:
            with contextlib.suppress(RuntimeError):
                inner["loop"].call_soon_threadsafe(inner["task"].cancel)
        await asyncio.to_thread(thread.join)
        raise
