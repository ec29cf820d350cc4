"""Lifecycle observers: what the sandbox service tells diagnostics and metrics as it works.

The service calls these at each step; observers record events, time operations and count
outcomes without the service knowing of them. Methods must be cheap and must not raise
(``Observers`` swallows and logs what one raises, so a broken observer never fails a create).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sandlot.runtime.base import ContainerInfo
    from sandlot.server.models import SandboxRecord, SandboxState

log = logging.getLogger(__name__)


class LifecycleObserver:
    """Every hook does nothing by default; subclasses override what they need."""

    def transitioned(self, rec: SandboxRecord, before: SandboxState) -> None:
        """``rec`` has just moved from ``before`` to ``rec.state`` (also on restarts)."""

    def step(self, rec: SandboxRecord, step: str, detail: str) -> None:
        """The runtime reported a provisioning step ("Pulling", "Pulled", "Starting")."""

    def policy_changed(self, rec: SandboxRecord) -> None: ...

    def expiring(self, rec: SandboxRecord) -> None:
        """``rec`` reached its ``expiresAt`` and is being deleted."""

    def container_ended(self, rec: SandboxRecord, info: ContainerInfo) -> None:
        """The runtime saw the sandbox's container stop or vanish on its own."""

    def recovered(self, rec: SandboxRecord) -> None:
        """A server start found ``rec``'s container alive and took it up again."""

    async def before_delete(self, rec: SandboxRecord) -> None:
        """The container is about to be removed (its files and logs go with it)."""


class Observers(LifecycleObserver):
    """Fans every hook out to the registered observers, isolating their failures."""

    def __init__(self) -> None:
        self._all: list[LifecycleObserver] = []

    def add(self, observer: LifecycleObserver) -> None:
        self._all.append(observer)

    def transitioned(self, rec: SandboxRecord, before: SandboxState) -> None:
        for o in self._all:
            with _logged("transitioned"):
                o.transitioned(rec, before)

    def step(self, rec: SandboxRecord, step: str, detail: str) -> None:
        for o in self._all:
            with _logged("step"):
                o.step(rec, step, detail)

    def policy_changed(self, rec: SandboxRecord) -> None:
        for o in self._all:
            with _logged("policy_changed"):
                o.policy_changed(rec)

    def expiring(self, rec: SandboxRecord) -> None:
        for o in self._all:
            with _logged("expiring"):
                o.expiring(rec)

    def container_ended(self, rec: SandboxRecord, info: ContainerInfo) -> None:
        for o in self._all:
            with _logged("container_ended"):
                o.container_ended(rec, info)

    def recovered(self, rec: SandboxRecord) -> None:
        for o in self._all:
            with _logged("recovered"):
                o.recovered(rec)

    async def before_delete(self, rec: SandboxRecord) -> None:
        for o in self._all:
            try:
                await o.before_delete(rec)
            except Exception:  # noqa: BLE001 - see the module docstring
                log.exception("observer %s failed in before_delete", type(o).__name__)


@contextlib.contextmanager
def _logged(hook: str) -> Iterator[None]:
    try:
        yield
    except Exception:  # noqa: BLE001 - see the module docstring
        log.exception("lifecycle observer failed in %s", hook)
