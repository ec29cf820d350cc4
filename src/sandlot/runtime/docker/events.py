"""Following the engine's events: containers of this sandlot that die or are removed.

The engine is the only one that sees a container removed with its own tools (``docker rm``)
or an init that exited; its event stream says so as it happens. The stream is a blocking
HTTP response, so it is read on a thread of its own, reconnected when the engine restarts,
and each sandbox id it names is handed to the event loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sandlot.runtime.docker.container import LABEL_OWNER, sandbox_of

log = logging.getLogger(__name__)
RECONNECT_DELAY = 1.0


class ContainerEvents:
    """Calls ``seen(sandbox_id)`` (on the reader thread) for each die/destroy event."""

    def __init__(self, api: Any, owner: str, seen: Callable[[str], None]) -> None:
        self.api = api
        self.owner = owner
        self.seen = seen
        self._stopped = threading.Event()
        self._stream: Any = None
        self._thread = threading.Thread(target=self._run, name="sandlot-docker-events",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        filters = {"type": "container", "event": ["die", "destroy"],
                   "label": [f"{LABEL_OWNER}={self.owner}"]}
        while not self._stopped.is_set():
            try:
                self._stream = self.api.events(decode=True, filters=filters)
                for event in self._stream:
                    attributes = (event.get("Actor") or {}).get("Attributes") or {}
                    sandbox_id = sandbox_of(str(attributes.get("name") or ""))
                    if sandbox_id:  # not a warm container's
                        self.seen(sandbox_id)
            except Exception:  # noqa: BLE001 - the engine went away: try again shortly
                if self._stopped.is_set():
                    return
                log.warning("docker event stream failed; reconnecting", exc_info=True)
            self._stopped.wait(RECONNECT_DELAY)

    def stop(self, timeout: float = 5.0) -> None:
        self._stopped.set()
        stream = self._stream
        if stream is not None:
            try:
                stream.close()
            except Exception:  # noqa: BLE001 - closing a broken stream
                log.debug("closing the docker event stream failed", exc_info=True)
        deadline = time.monotonic() + timeout
        if self._thread.is_alive():
            self._thread.join(max(0.0, deadline - time.monotonic()))
