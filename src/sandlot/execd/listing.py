"""``GET /directories/list``: the JSON array of every entry's ``file_info``, written as text.

Why text: building a dict per entry for the generic JSON encoder took two thirds of the
time (py-spy, docs/benchmarks.md). Only names need escaping (one encoder call per run of
entries), the other fields are numbers and fixed ASCII; type, owner, group and mode come
from a cache keyed by the few (mode, uid, gid) a directory has, and a file whose change time
equals its modification time (most) formats one timestamp. Each run of the walk
(``walk.runs``) is formatted in one loop: for 10,000 files a generator step and a kept
(path, stat) tuple per entry cost as much as the text itself. The bytes are those of
``json.dumps([file_info(...)], ensure_ascii=False, separators=(",", ":"))``, except for names
that are not UTF-8: each undecodable byte is written as U+FFFD, as the reference's JSON
encoder does (``json.dumps`` output could not be encoded at all: a 500).

Not streamed: sending a long listing in chunked pieces while the walk goes on (so that the
server's relay and the client read meanwhile) was measured through a sandbox, paired with
this whole-body answer under the same load: it cost execd ~5 ms more CPU per 10,000 entries
(a socket write and a loop pass per piece) and answered ~5 ms later (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import re
from functools import lru_cache

from sandlot.execd import walk
from sandlot.execd.fileinfo import entry_type, group_name, iso_ns, mode_digits, user_name

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
    lead = '{"path":"' + _json_text(prefix)[1:-1]
    append, fields, stamp = out.append, _fields, iso_ns
    for name, st in zip(_json_names(names), stats, strict=True):
        mtime, ctime = st.st_mtime_ns, st.st_ctime_ns
        head, tail = fields(st.st_mode, st.st_uid, st.st_gid)
        modified = stamp(mtime)
        created = modified if ctime == mtime else stamp(ctime)
        append(f'{lead}{name}",{head}{st.st_size},"modified_at":"{modified}",'
               f'"created_at":"{created}",{tail}')


def _utf8(text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:  # a name that is not UTF-8
        return _UNDECODABLE.sub("\ufffd", text).encode()


def listing_json(root: str, max_depth: int | None, run_limit: int = walk.RUN_LIMIT) -> bytes:
    """The listing of ``root`` (``max_depth`` and ``run_limit`` as ``walk.runs``'s); an
    unreadable ``root`` raises ``OSError``."""
    out: list[str] = []
    for prefix, names, stats in walk.runs(root, max_depth=max_depth, limit=run_limit):
        _format(prefix, names, stats, out)
    return _utf8("[" + ",".join(out) + "]")
