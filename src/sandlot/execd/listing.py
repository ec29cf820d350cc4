"""``GET /directories/list``: the JSON array of every entry's ``file_info``, written as text
while the walk goes on and sent in pieces.

Why pieces: a 10,000-entry listing is ~1.8 MB of JSON and ~60 ms of execd's CPU (the
``lstat`` calls through the sandbox's overlay file system are most of it). Written whole,
nothing reached the client before the last entry was formatted, and then the server's relay
and the client copied the body while execd sat idle. Sent in pieces of ``walk.RUN_LIMIT``
entries (chunked, as the reference's Go server sends any body of more than 2 KiB), the relay
and the client read one piece on the other CPU while execd stats and formats the next. A
listing that fits in one piece is sent whole, with its Content-Length, as before.

Why text: building a dict per entry for the generic JSON encoder took two thirds of the
time (py-spy, docs/benchmarks.md). Only names need escaping (one encoder call per run of
entries), the other fields are numbers and fixed ASCII; type, owner, group and mode come
from a cache keyed by the few (mode, uid, gid) a directory has, and a file whose change time
equals its modification time (most) formats one timestamp. The bytes are those of
``json.dumps([file_info(...)], ensure_ascii=False, separators=(",", ":"))``, except for names
that are not UTF-8: each undecodable byte is written as U+FFFD, as the reference's JSON
encoder does (``json.dumps`` output could not be encoded at all).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
from collections.abc import AsyncIterator, Iterator
from functools import lru_cache

from starlette.responses import Response, StreamingResponse

from sandlot.execd import walk
from sandlot.execd.fileinfo import entry_type, group_name, iso, iso_second, mode_digits, user_name

MEDIA_TYPE = "application/json"
_json_text = json.JSONEncoder(ensure_ascii=False).encode  # a str's JSON literal
# What the file system decoder makes of undecodable bytes (one lone surrogate each).
_UNDECODABLE = re.compile("[\udc80-\udcff]")


@lru_cache(maxsize=1024)
def _fields(st_mode: int, uid: int, gid: int) -> tuple[str, str]:
    """(``"type":..,"size":``, ``"owner":..,"group":..,"mode":N}``): the fields that come
    from few distinct values, before and after the size and times."""
    return (f'"type":"{entry_type(st_mode)}","size":',
            f'"owner":{_json_text(user_name(uid))},"group":{_json_text(group_name(gid))},'
            f'"mode":{mode_digits(st_mode)}}}')


def _json_names(names: list[str]) -> list[str]:
    """Each name's JSON literal without its quotes, in one encoder call for all of them:
    joined by ``/``, which no name holds and the encoder leaves as it is (an escape-based
    separator could be mistaken for a name's own backslash and letters)."""
    return _json_text("/".join(names))[1:-1].split("/")


def _format(prefix: str, names: list[str], stats: list[os.stat_result],
            out: list[str]) -> None:
    """Append each entry's JSON object to ``out``."""
    path_prefix = _json_text(prefix)[1:-1]
    append, fields, second = out.append, _fields, iso_second
    for name, st in zip(_json_names(names), stats, strict=True):
        mode, mtime, ctime = st.st_mode, st.st_mtime_ns, st.st_ctime_ns
        head, tail = fields(mode, st.st_uid, st.st_gid)
        sec, rem = divmod(mtime, 1_000_000_000)
        day_time = second(sec)
        if day_time is None:
            modified = iso(mtime / 1e9)
        else:
            us = rem // 1000
            modified = f"{day_time}.{us:06d}Z" if us else f"{day_time}Z"
        if ctime == mtime:
            created = modified
        else:
            sec, rem = divmod(ctime, 1_000_000_000)
            day_time = second(sec)
            if day_time is None:
                created = iso(ctime / 1e9)
            else:
                us = rem // 1000
                created = f"{day_time}.{us:06d}Z" if us else f"{day_time}Z"
        append(f'{{"path":"{path_prefix}{name}",{head}{st.st_size},"modified_at":"{modified}",'
               f'"created_at":"{created}",{tail}')


def _utf8(text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:  # a name that is not UTF-8
        return _UNDECODABLE.sub("\ufffd", text).encode()


def pieces(root: str, max_depth: int | None,
           piece_entries: int = walk.RUN_LIMIT) -> Iterator[tuple[bytes, bool]]:
    """The listing's JSON in pieces of about ``piece_entries`` entries, each with whether
    more follow; together they are the whole array. ``root`` is opened and listed for the
    first piece: its errors (``OSError``) raise there, before anything is sent."""
    out: list[str] = []
    opened = "["
    for prefix, names, stats in walk.runs(root, max_depth=max_depth, limit=piece_entries):
        _format(prefix, names, stats, out)
        if len(out) >= piece_entries:
            yield _utf8(opened + ",".join(out)), True
            opened = ","
            out.clear()
    if out:
        yield _utf8(opened + ",".join(out) + "]"), False
    else:
        yield (b"[]" if opened == "[" else b"]"), False


def listing_json(root: str, max_depth: int | None) -> bytes:
    """The whole listing at once."""
    return b"".join(piece for piece, _ in pieces(root, max_depth))


def response(listing: Iterator[tuple[bytes, bool]]) -> Response:
    """The response for ``pieces``: its first piece must come first (so that ``root``'s
    errors are raised before a response exists)."""
    first, more = next(listing)
    if not more:
        return Response(first, media_type=MEDIA_TYPE)
    return StreamingResponse(_send(first, listing), media_type=MEDIA_TYPE)


async def _send(first: bytes, rest: Iterator[tuple[bytes, bool]]) -> AsyncIterator[bytes]:
    yield first
    while True:
        # One loop pass before the next piece is made: the socket takes what is still
        # buffered of the previous one (the relay has read some meanwhile), and other
        # requests are not held up for the whole walk.
        await asyncio.sleep(0)
        item = next(rest, None)
        if item is None:
            return
        yield item[0]
