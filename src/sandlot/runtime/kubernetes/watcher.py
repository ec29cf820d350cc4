"""One watch on this sandlot's Pods: creates wait on it, and changes behind sandlot's back
are reported from it.

A list, then a watch from the list's resourceVersion, again after every expiry or error
(the informer pattern, without a client-side cache library). Creates wait on a condition
instead of polling the API server, so twenty concurrent creates cost one watch, not twenty
polling loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from kubernetes_asyncio import watch
from kubernetes_asyncio.client import CoreV1Api
from kubernetes_asyncio.client.exceptions import ApiException

log = logging.getLogger(__name__)

# (event type "ADDED" | "MODIFIED" | "DELETED", the Pod) for every change seen.
PodListener = Callable[[str, Any], None]


class PodWatch:
    """The current Pods with ``selector`` in ``namespace``, kept up to date."""

    def __init__(self, core: CoreV1Api, namespace: str, selector: str) -> None:
        self.core = core
        self.namespace = namespace
        self.selector = selector
        self.pods: dict[str, Any] = {}  # Pod name -> V1Pod
        self.listeners: list[PodListener] = []
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self._synced = asyncio.Event()

    async def start(self) -> None:
        """Start watching; returns after the first list."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        await self._synced.wait()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    async def wait_for(self, name: str, done: Callable[[Any], bool], timeout: float) -> Any:
        """Wait until ``done(pod or None)`` holds for Pod ``name``; the Pod (or None).

        Raises ``TimeoutError`` after ``timeout`` seconds.
        """
        async with asyncio.timeout(timeout), self._changed:
            while not done(self.pods.get(name)):
                await self._changed.wait()
            return self.pods.get(name)

    async def _run(self) -> None:
        while True:
            try:
                version = await self._relist()
                await self._follow(version)
            except asyncio.CancelledError:
                raise
            except ApiException as exc:
                if exc.status != 410:  # 410 Gone: the version expired; list again
                    log.warning("watching Pods failed (%s); listing again", exc.reason)
                    await asyncio.sleep(1)
            except Exception:  # noqa: BLE001 - a broken connection: list and watch again
                log.warning("watching Pods failed; listing again", exc_info=True)
                await asyncio.sleep(1)

    async def _relist(self) -> str:
        found = await self.core.list_namespaced_pod(self.namespace, label_selector=self.selector)
        fresh = {p.metadata.name: p for p in found.items}
        gone = [p for name, p in self.pods.items() if name not in fresh]
        self.pods = fresh
        for pod in gone:
            self._emit("DELETED", pod)
        self._synced.set()
        await self._notify()
        return str(found.metadata.resource_version)

    async def _follow(self, version: str) -> None:
        stream = watch.Watch()
        try:
            async for event in stream.stream(
                    self.core.list_namespaced_pod, self.namespace,
                    label_selector=self.selector, resource_version=version,
                    timeout_seconds=300, allow_watch_bookmarks=True):
                kind = event["type"]
                pod = event["object"]
                if kind == "BOOKMARK":
                    continue
                name = pod.metadata.name
                if kind == "DELETED":
                    self.pods.pop(name, None)
                else:
                    self.pods[name] = pod
                self._emit(kind, pod)
                await self._notify()
        finally:
            stream.stop()
            with contextlib.suppress(Exception):
                await stream.close()

    def _emit(self, kind: str, pod: Any) -> None:
        for listener in self.listeners:
            try:
                listener(kind, pod)
            except Exception:  # noqa: BLE001 - one listener must not stop the watch
                log.warning("a Pod listener failed", exc_info=True)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()
