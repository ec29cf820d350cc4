"""Short-lived download URLs of diagnostics payloads (the spec's ``delivery: url``).

A URL is a capability, as a presigned object-store URL is: ``/v1/diagnostics/downloads/<token>``
with 256 random bits, made only for a caller that passed the API key and tenant checks, readable
without a key (the CLI prints it for a human or a tool to fetch) until ``expiresAt``. Payloads
are snapshots kept in this server's memory, bounded in total (the oldest go first), and gone
with a restart; on a server behind a load balancer the URL must reach the server that made it.
"""

from __future__ import annotations

import secrets
import time
from collections import OrderedDict
from dataclasses import dataclass

PATH_PREFIX = "/v1/diagnostics/downloads/"
MAX_TOTAL_BYTES = 256 << 20


@dataclass(frozen=True)
class Download:
    body: bytes
    expires_at: float  # UTC epoch seconds


class DiagnosticDownloads:
    def __init__(self, ttl_seconds: float, max_total_bytes: int = MAX_TOTAL_BYTES) -> None:
        self.ttl_seconds = ttl_seconds
        self.max_total_bytes = max_total_bytes
        self._items: OrderedDict[str, Download] = OrderedDict()  # oldest first
        self._total = 0

    def put(self, body: bytes) -> tuple[str, float]:
        """Keep ``body``; returns the URL's path and its expiry (epoch seconds)."""
        self._expire()
        while self._items and self._total + len(body) > self.max_total_bytes:
            self._drop(next(iter(self._items)))
        token = secrets.token_urlsafe(32)
        item = Download(body, time.time() + self.ttl_seconds)
        self._items[token] = item
        self._total += len(body)
        return PATH_PREFIX + token, item.expires_at

    def get(self, token: str) -> bytes | None:
        """The payload, or None once expired (or never made)."""
        self._expire()
        item = self._items.get(token)
        return item.body if item is not None else None

    def _expire(self) -> None:
        now = time.time()
        for token in [t for t, item in self._items.items() if item.expires_at <= now]:
            self._drop(token)

    def _drop(self, token: str) -> None:
        item = self._items.pop(token)
        self._total -= len(item.body)
