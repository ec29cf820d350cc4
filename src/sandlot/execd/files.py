"""``/files*`` and ``/directories*``: metadata, delete, chmod/chown, move, glob search,
text replace, streamed multipart upload, ranged download, listing, mkdir -p, rm -r.

Errors are the reference execd's (``pkg/web/controller/filesystem*.go``): a missing path ->
404 ``FILE_NOT_FOUND``, any other failure of the operation -> 500 ``RUNTIME_ERROR``, a missing
query parameter -> 400 ``MISSING_QUERY``, a malformed request -> 400 ``INVALID_REQUEST_BODY``.
Paths expand ``~`` and ``$VAR`` (see ``paths``). Modes travel as octal digits written in
decimal (``755`` means ``0o755``).
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import re
import shutil
import stat
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import BaseRoute, Mount, Route

from sandlot.errors import (
    Forbidden,
    InvalidRequest,
    NotFound,
    RuntimeFailure,
    SandlotError,
    Unsupported,
)
from sandlot.execd import listing, memory, paths
from sandlot.execd.fileinfo import file_info
from sandlot.execd.http import (
    JSON,
    bad_request,
    expect_object,
    json_body,
    missing_query,
    ok,
)
from sandlot.execd.settings import Settings
from sandlot.execd.walk import walk

CHUNK = 1 << 20


# errors -------------------------------------------------------------------------------
def os_error(exc: OSError, path: str, doing: str = "error accessing file") -> SandlotError:
    """The reference's error for an OSError on ``path``: 404 ``FILE_NOT_FOUND`` when it does
    not exist, else 500 ``RUNTIME_ERROR``."""
    reason = exc.strerror or str(exc)
    if exc.errno == errno.ENOENT:
        return NotFound(f"file not found. {path}: {reason}", code="FILE_NOT_FOUND")
    return RuntimeFailure(f"{doing} {path}. {reason}")


def failure(doing: str, path: str, reason: str) -> RuntimeFailure:
    return RuntimeFailure(f"{doing} {path}. {reason}")


# conversions --------------------------------------------------------------------------
def parse_mode(value: Any, *, default: int) -> int:
    """``755`` / ``"0755"`` (octal digits) -> 0o755; 0/None -> ``default``."""
    if value is None or value == 0 or value == "":
        return default
    text = str(value)
    if not re.fullmatch(r"0?[0-7]{1,4}", text):
        raise bad_request(f"mode must be octal digits like 644 or 755, got {value!r}")
    return int(text, 8)


# Largest id chown(2) takes: (uid_t)-1 means "unchanged", so ids run 0 .. 2**32 - 2.
_MAX_ID = 2**32 - 2


def _numeric_id(value: Any, field: str) -> int:
    number = int(value)
    if not 0 <= number <= _MAX_ID:
        raise bad_request(f"{field} {value} is out of range (0..{_MAX_ID})")
    return number


def resolve_uid(owner: Any) -> int:
    if isinstance(owner, int) or (isinstance(owner, str) and owner.isdigit()):
        return _numeric_id(owner, "owner")
    try:
        return pwd.getpwnam(str(owner)).pw_uid
    except KeyError:
        raise RuntimeFailure(f"failed to lookup user {owner}: unknown user") from None


def resolve_gid(group: Any) -> int:
    if isinstance(group, int) or (isinstance(group, str) and group.isdigit()):
        return _numeric_id(group, "group")
    try:
        return grp.getgrnam(str(group)).gr_gid
    except KeyError:
        raise RuntimeFailure(f"failed to lookup group {group}: unknown group") from None


def apply_owner(path: str, owner: Any, group: Any) -> None:
    if not owner and not group:
        return
    uid = resolve_uid(owner) if owner else -1
    gid = resolve_gid(group) if group else -1
    os.chown(path, uid, gid)


# path handling ------------------------------------------------------------------------
class Paths:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    def abs(self, path: str) -> str:
        if not isinstance(path, str) or not path:
            raise bad_request("path must be a non-empty string")
        if "\0" in path:
            raise bad_request("path must not contain NUL bytes")
        path = paths.expand(path)
        return os.path.normpath(
            path if os.path.isabs(path) else os.path.join(self.settings.workdir, path)
        )


# route handlers -----------------------------------------------------------------------
class FileRoutes:
    def __init__(self, settings: Settings) -> None:
        self.paths = Paths(settings)

    async def info(self, request: Request) -> Response:
        """Metadata of each ``path`` (a symlink's own, not its target's); none asked: ``{}``."""
        result: dict[str, Any] = {}
        for raw in [v for v in request.query_params.getlist("path") if v]:
            path = self.paths.abs(raw)
            try:
                result[raw] = file_info(path, os.lstat(path))
            except OSError as exc:
                raise os_error(exc, raw) from None
            result[raw]["path"] = path
        return JSON(result)

    async def remove_files(self, request: Request) -> Response:
        """Delete files; one that does not exist is not an error (as the reference)."""
        for raw in [v for v in request.query_params.getlist("path") if v]:
            path = self.paths.abs(raw)
            try:
                if stat.S_ISDIR(os.stat(path).st_mode):
                    raise failure("error removing file", raw, f"path is a directory: {raw}")
                os.unlink(path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise failure("error removing file", raw, exc.strerror or str(exc)) from None
        return ok()

    async def permissions(self, request: Request) -> Response:
        body = expect_object(await json_body(request))
        for raw, perm in body.items():
            path = self.paths.abs(raw)
            perm = expect_object(perm, f"permission for {raw}")
            try:
                if perm.get("mode") not in (None, "", 0):
                    os.chmod(path, parse_mode(perm.get("mode"), default=0o755))
                apply_owner(path, perm.get("owner"), perm.get("group"))
            except OSError as exc:
                raise failure("error changing permissions for", raw,
                              exc.strerror or str(exc)) from None
        return ok()

    async def move(self, request: Request) -> Response:
        body = await json_body(request)
        if not isinstance(body, list):
            raise bad_request("request body must be a JSON array of {src, dest}")
        for item in body:
            item = expect_object(item, "move item")
            src, dest = item.get("src"), item.get("dest")
            if not isinstance(src, str) or not isinstance(dest, str) or not src or not dest:
                raise bad_request("each move item needs 'src' and 'dest'")
            s, d = self.paths.abs(src), self.paths.abs(dest)
            try:
                os.lstat(s)
            except OSError as exc:
                raise os_error(exc, src) from None
            try:  # as the reference: the destination's parents are made, it must not exist
                os.makedirs(os.path.dirname(d) or "/", mode=0o755, exist_ok=True)
            except OSError as exc:
                raise failure("failed to create destination directory for", dest,
                              exc.strerror or str(exc)) from None
            if os.path.lexists(d):
                raise failure("error renaming", src, f"destination path already exists: {dest}")
            try:
                os.rename(s, d)
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    raise os_error(exc, src) from None
                try:
                    shutil.move(s, d)
                except OSError as exc2:
                    raise os_error(exc2, src) from None
        return ok()

    async def search(self, request: Request) -> Response:
        """Files under ``path`` (or ``path`` itself, a file) whose base name matches the
        doublestar ``pattern`` (default ``**``), as the reference matches them."""
        raw = request.query_params.get("path")
        if not raw:
            raise missing_query("path")
        root = self.paths.abs(raw)
        pattern = request.query_params.get("pattern") or "**"
        try:
            root_st = os.stat(root)
        except OSError as exc:
            raise os_error(exc, raw) from None
        matcher = glob_matcher(pattern)
        found = [(root, os.lstat(root))] if not stat.S_ISDIR(root_st.st_mode) else walk(
            root, max_depth=None
        )
        results = []
        for path, st in found:
            if stat.S_ISDIR(st.st_mode):
                continue
            if matcher(os.path.basename(path)):
                results.append(file_info(path, st))
        return JSON(results)

    async def replace(self, request: Request) -> Response:
        verbose = request.query_params.get("verbose", "").lower() in ("1", "true", "yes")
        body = expect_object(await json_body(request))
        plan: list[tuple[str, str, str, str]] = []
        for raw, item in body.items():
            item = expect_object(item, f"replacement for {raw}")
            old, new = item.get("old"), item.get("new")
            if not isinstance(old, str) or not old:
                raise bad_request(f"{raw}: 'old' must be a non-empty string")
            if not isinstance(new, str):
                raise bad_request(f"{raw}: 'new' must be a string")
            plan.append((raw, self.paths.abs(raw), old, new))
        counts: dict[str, dict[str, int]] = {}
        for raw, path, old, new in plan:
            try:
                st = os.stat(path)
                if not stat.S_ISREG(st.st_mode):
                    raise InvalidRequest(f"{raw}: not a regular file", code="INVALID_PATH")
                with open(path, "rb") as fh:
                    data = fh.read()
                count = data.count(old.encode())
                if count:
                    write_atomically(path, data.replace(old.encode(), new.encode()), st)
            except OSError as exc:
                raise os_error(exc, raw) from None
            counts[raw] = {"replacedCount": count}
        return JSON(counts) if verbose else ok()

    async def upload(self, request: Request) -> Response:
        from sandlot.execd.upload import receive_upload

        await receive_upload(request, self.paths.abs)
        return ok()

    async def download(self, request: Request) -> Response:
        raw = request.query_params.get("path")
        if not raw:
            raise missing_query("path")
        path = self.paths.abs(raw)
        offset = _line_param(request, "offset")
        limit = _line_param(request, "limit")
        range_header = request.headers.get("range")
        if (offset is not None or limit is not None) and range_header:
            raise bad_request(
                "line-based reading (offset/limit) and byte range (Range header) are "
                "mutually exclusive"
            )
        try:
            # Opened only to check access; the body generator reopens it, so a response that
            # is never iterated (client gone) cannot leak a descriptor.
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            st = os.fstat(fd)
            os.close(fd)
        except OSError as exc:
            raise os_error(exc, raw) from None
        if stat.S_ISDIR(st.st_mode):
            raise InvalidRequest(f"{raw}: is a directory", code="INVALID_PATH")
        if offset is not None or limit is not None:
            return StreamingResponse(
                _lines(path, offset or 1, limit), media_type="text/plain; charset=utf-8"
            )
        size = st.st_size
        headers = {
            "Content-Disposition": content_disposition(os.path.basename(path)),
            "Accept-Ranges": "bytes",
            "Last-Modified": _http_date(st.st_mtime),
        }
        if range_header:
            rng = parse_range(range_header, size)
            if rng is None:  # the reference's body: {"code": "UNKNOWN"}
                return JSON(
                    {"code": "UNKNOWN"},
                    status_code=416,
                    headers={"Content-Range": f"bytes */{size}"},
                )
            start, end = rng
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
            headers["Content-Length"] = str(end - start)
            return StreamingResponse(
                _chunks(path, start, end),
                status_code=206,
                media_type="application/octet-stream",
                headers=headers,
            )
        headers["Content-Length"] = str(size)
        return StreamingResponse(
            _chunks(path, 0, size), media_type="application/octet-stream", headers=headers
        )

    async def list_dir(self, request: Request) -> Response:
        raw = request.query_params.get("path")
        if not raw:
            raise missing_query("path")
        raw_depth = request.query_params.get("depth") or ""
        depth = 1
        if raw_depth:
            try:
                depth = int(raw_depth)
            except ValueError:
                depth = -1
            if depth < 0:
                raise bad_request(f"invalid query parameter 'depth': {raw_depth}")
        path = self.paths.abs(raw)
        try:
            st = os.lstat(path)
        except OSError as exc:
            raise os_error(exc, raw) from None
        if stat.S_ISLNK(st.st_mode):
            raise bad_request(f"path is a symbolic link, refusing to traverse: {path}")
        if not stat.S_ISDIR(st.st_mode):
            raise bad_request(f"path is not a directory: {path}")
        try:
            body = listing.listing_json(path, depth)
        except OSError as exc:
            raise failure("error listing directory", raw, exc.strerror or str(exc)) from None
        return Response(body, media_type="application/json")

    async def make_dirs(self, request: Request) -> Response:
        body = expect_object(await json_body(request))
        for raw, perm in body.items():
            perm = expect_object(perm or {}, f"permission for {raw}")
            path = self.paths.abs(raw)
            mode = parse_mode(perm.get("mode"), default=0o755)
            try:
                existed = os.path.exists(path)
                os.makedirs(path, exist_ok=True)
                if not existed:  # as the reference: an existing directory keeps its mode
                    os.chmod(path, mode)  # makedirs' mode is filtered by the umask
                    apply_owner(path, perm.get("owner"), perm.get("group"))
            except FileExistsError:
                raise failure("error creating directory", raw, "not a directory") from None
            except OSError as exc:
                raise os_error(exc, raw) from None
        return ok()

    async def remove_dirs(self, request: Request) -> Response:
        """Remove each path recursively, as ``rm -rf``: a missing one is not an error, a file
        is removed too (as the reference's ``os.RemoveAll``); ``/`` is refused."""
        for raw in [v for v in request.query_params.getlist("path") if v]:
            path = self.paths.abs(raw)
            if path == "/":
                raise Forbidden("refusing to delete /", code="PERMISSION_DENIED")
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise failure("error removing directory", raw, exc.strerror or str(exc)) from None
            if not stat.S_ISDIR(st.st_mode):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    raise failure("error removing directory", raw,
                                  exc.strerror or str(exc)) from None
                continue
            failures: list[OSError] = []

            def collect(_f: Any, _p: str, info: Any, sink: list[OSError] = failures) -> None:
                sink.append(info[1])

            shutil.rmtree(path, onerror=collect)
            failures = [f for f in failures if not isinstance(f, FileNotFoundError)]
            if failures:
                raise failure("error removing directory", raw,
                              failures[0].strerror or str(failures[0]))
        return ok()


def glob_matcher(pattern: str) -> Any:
    """Match a file's base name against a doublestar pattern (``*``, ``?``, ``[..]``,
    ``{a,b}``, ``**``), as the reference's search does; ``**`` matches every name."""
    if pattern == "**":
        return lambda name: True
    # Imported by the first search, not at start-up: every sandbox's execd starts, few search.
    from wcmatch import glob as wcglob

    try:
        compiled = wcglob.compile(pattern, flags=wcglob.GLOBSTAR | wcglob.BRACE | wcglob.DOTGLOB)
    except (ValueError, re.error) as exc:
        raise RuntimeFailure(f"error searching files. invalid pattern {pattern}: {exc}") from None
    return compiled.match


def content_disposition(name: str) -> str:
    """``attachment`` with the file name; a non-ASCII name percent-encoded (RFC 5987), in
    the reference's exact form."""
    if name.isascii():
        return f'attachment; filename="{name}"'
    encoded = quote(name, safe="!$&'()*+,;=:@~")  # Go's url.PathEscape keeps these
    return f"attachment; filename=\"{encoded}\"; filename*=UTF-8''{encoded}"


def _line_param(request: Request, name: str) -> int | None:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise bad_request(f"invalid query parameter '{name}': {raw}")
    return value


def write_atomically(path: str, data: bytes, st: os.stat_result) -> None:
    tmp = os.path.join(
        os.path.dirname(path), f".{os.path.basename(path)}.sandlot-tmp-{os.getpid()}"
    )
    fd = os.open(
        tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, stat.S_IMODE(st.st_mode)
    )
    try:
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        os.fchmod(fd, stat.S_IMODE(st.st_mode))
        try:
            os.fchown(fd, st.st_uid, st.st_gid)
        except PermissionError:
            pass
    finally:
        os.close(fd)
    os.replace(tmp, path)


def parse_range(header: str, size: int) -> tuple[int, int] | None:
    """First range of a ``bytes=`` header as [start, end); None when unsatisfiable."""
    unit, _, spec = header.partition("=")
    if unit.strip().lower() != "bytes" or not spec:
        return None
    first = spec.split(",")[0].strip()
    start_s, _, end_s = first.partition("-")
    try:
        if start_s == "":
            n = int(end_s)
            if n <= 0:
                return None
            return max(0, size - n), size
        start = int(start_s)
        end = int(end_s) + 1 if end_s else size
    except ValueError:
        return None
    end = min(end, size)
    if start >= size or start >= end:
        return None
    return start, end


async def _chunks(path: str, start: int, end: int) -> AsyncIterator[bytes]:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        pos = start
        while pos < end:
            block = os.pread(fd, min(CHUNK, end - pos), pos)
            if not block:
                break
            pos += len(block)
            yield block
    finally:
        os.close(fd)
        if end - start >= CHUNK:
            memory.trim_soon()


async def _lines(path: str, first: int, limit: int | None) -> AsyncIterator[bytes]:
    """Lines ``first``.. (1-based, at most ``limit``), each without its ``\\r``/``\\n``
    ending, joined by ``\\n`` with none after the last (the reference's shape)."""
    written = 0
    with open(path, "rb") as fh:
        for number, line in enumerate(fh, start=1):
            if number < first:
                continue
            if limit is not None and written >= limit:
                break
            line = line.rstrip(b"\r\n")
            yield b"\n" + line if written else line
            written += 1


def _http_date(ts: float) -> str:
    from email.utils import formatdate

    return formatdate(ts, usegmt=True)


async def _identity_unsupported(request: Request) -> Response:
    raise Unsupported(
        "file operations with an explicit uid/gid (/v1/filesystem/{uid}/{gid}/...) are not "
        "supported by this execd; run a command with uid/gid instead"
    )


def file_routes(settings: Settings) -> list[BaseRoute]:
    r = FileRoutes(settings)
    return [
        Route("/files/info", r.info, methods=["GET"]),
        Route("/files", r.remove_files, methods=["DELETE"]),
        Route("/files/permissions", r.permissions, methods=["POST"]),
        Route("/files/mv", r.move, methods=["POST"]),
        Route("/files/search", r.search, methods=["GET"]),
        Route("/files/replace", r.replace, methods=["POST"]),
        Route("/files/upload", r.upload, methods=["POST"]),
        Route("/files/download", r.download, methods=["GET"]),
        Route("/directories/list", r.list_dir, methods=["GET"]),
        Route("/directories", r.make_dirs, methods=["POST"]),
        Route("/directories", r.remove_dirs, methods=["DELETE"]),
        Mount(
            "/v1/filesystem",
            routes=[
                Route(
                    "/{rest:path}", _identity_unsupported, methods=["GET", "POST", "DELETE", "PUT"]
                )
            ],
        ),
    ]
