"""API keys are kept as SHA-256 digests only: ``sha256:<hex>`` in a file is used as is, a
plaintext key is hashed when the file is read and the plaintext dropped.

SHA-256 rather than a slow password hash: API keys are long random secrets (no dictionary
to slow down), and a digest can be looked up directly, so checking a key costs one hash
whatever the number of tenants. Lookups are by digest: timing reveals nothing about a key.
"""

from __future__ import annotations

import hashlib
import re

SHA256_PREFIX = "sha256:"
_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")
MIN_PLAINTEXT_LENGTH = 16


def digest(key: str | bytes) -> str:
    raw = key.encode() if isinstance(key, str) else key
    return hashlib.sha256(raw).hexdigest()


def stored_digest(entry: str) -> str:
    """The digest an ``api_keys`` entry stands for (a ``sha256:`` hash or a plaintext key)."""
    if entry.startswith(SHA256_PREFIX):
        hexpart = entry[len(SHA256_PREFIX):]
        if not _HEX64.match(hexpart):
            raise ValueError(f"{entry[:20]}...: a sha256: entry needs 64 hex digits")
        return hexpart.lower()
    if not entry:
        raise ValueError("an empty API key")
    return digest(entry)


def is_weak_plaintext(entry: str) -> bool:
    return not entry.startswith(SHA256_PREFIX) and len(entry) < MIN_PLAINTEXT_LENGTH


def hashed(key: str) -> str:
    """What to write into a tenants file instead of ``key`` (``sandlot hash-key``)."""
    return SHA256_PREFIX + digest(key)
