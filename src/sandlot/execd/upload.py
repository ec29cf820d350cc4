"""Streaming ``multipart/form-data`` upload: each ``metadata`` part (JSON: path, mode, owner,
group) names where the following ``file`` part goes; file bytes are written to disk as they
arrive (python-multipart's push parser), never gathered in memory or a spool file.

Each file is written to a hidden temp file beside its target and renamed into place when
complete, so a broken upload never leaves a half-written file under the real name.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from typing import Any

from python_multipart.multipart import MultipartParser, parse_options_header
from starlette.requests import Request

from sandlot.errors import InvalidRequest, SandlotError
from sandlot.execd import memory
from sandlot.execd.files import apply_owner, os_error, parse_mode


class _Target:
    def __init__(self, path: str, meta: dict[str, Any]) -> None:
        self.path = path
        self.meta = meta
        self.mode = parse_mode(meta.get("mode"), default=0o644)
        parent = os.path.dirname(path) or "/"
        os.makedirs(parent, exist_ok=True)
        self.tmp = os.path.join(
            parent, f".{os.path.basename(path)}.sandlot-upload-{os.getpid()}-{id(self)}"
        )
        self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)

    def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]

    def commit(self) -> None:
        os.fchmod(self.fd, self.mode)
        os.close(self.fd)
        self.fd = -1
        apply_owner(self.tmp, self.meta.get("owner"), self.meta.get("group"))
        os.replace(self.tmp, self.path)

    def abort(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
        with contextlib.suppress(OSError):
            os.unlink(self.tmp)


class _UploadParser:
    def __init__(self, resolve: Callable[[str], str]) -> None:
        self.resolve = resolve
        self.headers: dict[bytes, bytes] = {}
        self._field = b""
        self._value = b""
        self.part_name = b""
        self.meta_buf = bytearray()
        self.pending_meta: dict[str, Any] | None = None
        self.target: _Target | None = None
        self.files = 0
        self.error: SandlotError | None = None

    def callbacks(self) -> dict[str, Any]:
        return {
            "on_part_begin": self.on_part_begin,
            "on_header_field": self.on_header_field,
            "on_header_value": self.on_header_value,
            "on_header_end": self.on_header_end,
            "on_headers_finished": self.on_headers_finished,
            "on_part_data": self.on_part_data,
            "on_part_end": self.on_part_end,
        }

    def on_part_begin(self) -> None:
        self.headers = {}
        self.part_name = b""
        self.meta_buf = bytearray()

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._field += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._value += data[start:end]

    def on_header_end(self) -> None:
        self.headers[self._field.lower()] = self._value
        self._field = b""
        self._value = b""

    def on_headers_finished(self) -> None:
        _, params = parse_options_header(self.headers.get(b"content-disposition", b""))
        self.part_name = params.get(b"name", b"")
        if self.part_name == b"file":
            meta = self.pending_meta
            self.pending_meta = None
            if meta is None:
                raise _invalid("INVALID_FILE_METADATA", "metadata file is missing")
            path = meta.get("path")
            if not isinstance(path, str) or not path:
                raise _invalid("INVALID_FILE_METADATA", "metadata path is empty")
            resolved = self.resolve(path)
            try:
                self.target = _Target(resolved, meta)
            except OSError as exc:
                raise os_error(exc, path) from None

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self.part_name == b"metadata":
            self.meta_buf += data[start:end]
            if len(self.meta_buf) > 1 << 20:
                raise _invalid("INVALID_FILE_METADATA", "upload metadata part is too large")
        elif self.part_name == b"file" and self.target is not None:
            try:
                self.target.write(data[start:end])
            except OSError as exc:
                raise os_error(exc, self.target.path) from None

    def on_part_end(self) -> None:
        if self.part_name == b"metadata":
            try:
                meta = json.loads(bytes(self.meta_buf) or b"{}")
            except ValueError:
                raise _invalid("INVALID_FILE_METADATA", "invalid metadata format") from None
            if not isinstance(meta, dict):
                raise _invalid("INVALID_FILE_METADATA", "invalid metadata format: not an object")
            self.pending_meta = meta
        elif self.part_name == b"file" and self.target is not None:
            target, self.target = self.target, None
            try:
                target.commit()
            except OSError as exc:
                target.abort()
                raise os_error(exc, target.path) from None
            except SandlotError:
                target.abort()
                raise
            self.files += 1


def _invalid(code: str, message: str) -> InvalidRequest:
    """A 400 with the reference's upload error codes (INVALID_FILE, INVALID_FILE_METADATA,
    INVALID_FILE_CONTENT)."""
    return InvalidRequest(message, code=code)


async def receive_upload(request: Request, resolve: Callable[[str], str]) -> int:
    """Parse the request body into files on disk; returns how many were written."""
    ctype, params = parse_options_header(request.headers.get("content-type", ""))
    if ctype != b"multipart/form-data" or b"boundary" not in params:
        raise _invalid("INVALID_FILE", "multipart form is empty")
    state = _UploadParser(resolve)
    parser = MultipartParser(params[b"boundary"], callbacks=state.callbacks())  # type: ignore[arg-type]
    try:
        async for chunk in request.stream():
            if chunk:
                parser.write(chunk)
        parser.finalize()
    except SandlotError:
        raise
    except Exception as exc:  # the parser's own errors: malformed body
        raise _invalid("INVALID_FILE", f"malformed multipart body: {exc}") from None
    finally:
        if state.target is not None:
            state.target.abort()
        memory.trim_soon()
    if state.files == 0:
        if state.pending_meta is None:
            raise _invalid("INVALID_FILE_METADATA", "metadata file is missing")
        raise _invalid("INVALID_FILE_CONTENT", "file is missing")
    return state.files
