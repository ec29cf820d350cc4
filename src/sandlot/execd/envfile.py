"""The persisted-environment file named by ``EXECD_ENVS`` (the SDK's ``commands.set_env``).

The SDK appends ``KEY='value'`` (or ``KEY="escaped"``) lines to it; every later command and
session gets those variables. The file is re-read only when its mtime/size change.
"""

from __future__ import annotations

import os
import re

_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "$": "$", "`": "`"}


def _unquote(raw: str) -> str:
    raw = raw.strip()
    if len(raw) >= 2 and raw[0] == raw[-1] == "'":
        return raw[1:-1]
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        body, out, i = raw[1:-1], [], 0
        while i < len(body):
            ch = body[i]
            if ch == "\\" and i + 1 < len(body):
                nxt = body[i + 1]
                out.append(_ESCAPES.get(nxt, "\\" + nxt))
                i += 2
                continue
            out.append(ch)
            i += 1
        return "".join(out)
    return raw


def parse(text: str) -> dict[str, str]:
    result: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _LINE.match(line)
        if m:
            result[m.group(1)] = _unquote(m.group(2))
    return result


class EnvFile:
    """Cached view of the env file; ``values()`` is cheap when the file did not change."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._stamp: tuple[float, int] | None = None
        self._values: dict[str, str] = {}

    def values(self) -> dict[str, str]:
        if not self.path:
            return {}
        try:
            st = os.stat(self.path)
        except OSError:
            self._stamp, self._values = None, {}
            return {}
        stamp = (st.st_mtime, st.st_size)
        if stamp != self._stamp:
            try:
                with open(self.path, encoding="utf-8", errors="replace") as fh:
                    self._values = parse(fh.read())
            except OSError:
                self._values = {}
            self._stamp = stamp
        return dict(self._values)
