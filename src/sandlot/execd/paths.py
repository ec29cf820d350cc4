"""Path expansion as the reference execd does it (``pkg/util/pathutil``): ``$VAR`` and
``${VAR}`` from execd's environment (plus request overrides), then a leading ``~``.

A path naming an undefined variable is refused (the reference's rule), so ``$TYPO/x`` never
silently becomes ``/x``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from sandlot.errors import InvalidRequest

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def expand(path: str, overrides: Mapping[str, str] | None = None) -> str:
    """``path`` with variables and ``~`` expanded; ``InvalidRequest`` for undefined ones."""
    if not path or ("$" not in path and not path.startswith("~")):
        return path
    env: Mapping[str, str] = os.environ if not overrides else {**os.environ, **overrides}
    if "$" in path:
        missing = sorted({m[1] or m[2] for m in _VAR.finditer(path) if (m[1] or m[2]) not in env})
        if missing:
            raise InvalidRequest(
                f"path references undefined environment variables: {','.join(missing)}",
                code="INVALID_REQUEST_BODY",
            )
        path = _VAR.sub(lambda m: env[m[1] or m[2]], path)
    if path == "~" or path.startswith("~/"):
        home = os.path.expanduser("~")
        return home if path == "~" else os.path.join(home, path[2:])
    return path
