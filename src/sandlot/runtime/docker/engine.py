"""Reaching the Docker engine: one docker-py client, and its blocking calls off the event loop.

docker-py is synchronous (requests over the engine's socket); every call runs on a small
thread pool of its own so that slow engine calls (pulls, removals) never stall the server's
loop and never starve the default executor that other parts of the server use.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import docker
from docker.errors import DockerException

from sandlot.errors import RuntimeFailure

T = TypeVar("T")
DEFAULT_API_TIMEOUT = 180  # seconds; the reference server's default for [docker] api_timeout
# Engine calls in flight at once: creates, deletes, inspects of many sandboxes.
MAX_PARALLEL_CALLS = 16


class Engine:
    """A docker-py client found as the docker CLI finds its engine (``DOCKER_HOST`` etc.)."""

    def __init__(self, client: docker.DockerClient) -> None:
        self.client = client
        self.api = client.api
        self._pool = ThreadPoolExecutor(MAX_PARALLEL_CALLS, thread_name_prefix="sandlot-docker")

    @classmethod
    def from_env(cls, timeout: int | None) -> Engine:
        """Connect and check that the engine answers; ``RuntimeFailure`` says why not."""
        try:
            client = docker.from_env(timeout=timeout or DEFAULT_API_TIMEOUT)
            client.ping()
        except DockerException as exc:
            raise RuntimeFailure(
                f"the Docker engine is not reachable ({exc}); start dockerd or set DOCKER_HOST"
            ) from exc
        return cls(client)

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, functools.partial(fn, *args, **kwargs))

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        self.client.close()
