"""execd access tokens, derived from a server secret instead of stored.

``token(sandbox_id) = base64url(HMAC-SHA256(secret, "execd-token:" + id))``: the server
recomputes a sandbox's token whenever it needs it, so the database holds no token (sandboxes
created before this scheme keep the random token stored with them: their execd knows only
that one). The secret is 32 random bytes in ``data_dir/server.secret`` (0600), made at first
start and kept, so tokens survive restarts.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import stat
from pathlib import Path

from sandlot.datadir import UnsafeDataDir

SECRET_FILE = "server.secret"
_SECRET_BYTES = 32


def load_or_create_secret(data_dir: Path) -> bytes:
    path = data_dir / SECRET_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o600)
    except FileExistsError:
        return _read_secret(path)
    try:
        os.write(fd, secrets.token_bytes(_SECRET_BYTES))
        os.fsync(fd)
    finally:
        os.close(fd)
    return _read_secret(path)


def _read_secret(path: Path) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or stat.S_IMODE(st.st_mode) & 0o077:
            raise UnsafeDataDir(
                f"{path} must be owned by uid {os.geteuid()} and readable by it alone "
                f"(mode {stat.S_IMODE(st.st_mode):04o}): run `chmod 600 {path}`"
            )
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    if len(data) < _SECRET_BYTES:
        raise UnsafeDataDir(f"{path} is truncated ({len(data)} bytes); remove it only if no "
                            "sandbox of this server still runs (their tokens derive from it)")
    return data


class ExecdTokens:
    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def token(self, sandbox_id: str) -> str:
        mac = hmac.new(self._secret, b"execd-token:" + sandbox_id.encode(), hashlib.sha256)
        return base64.urlsafe_b64encode(mac.digest()).rstrip(b"=").decode()
