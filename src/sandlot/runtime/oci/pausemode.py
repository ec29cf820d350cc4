"""Which pause a sandbox gets: "freeze" (memory kept) or "hibernate" (checkpoint to disk).

The server's ``[runtime] pause_mode`` is the default; a create may choose per sandbox with
``extensions["sandlot.pause.mode"]``. The choice is written into the sandbox's folder at
create time, so it holds across server restarts and config changes.
"""

from __future__ import annotations

from typing import Any

from sandlot.errors import InvalidRequest
from sandlot.runtime.oci.layout import SandboxPaths

PAUSE_MODE_KEY = "sandlot.pause.mode"
MODES = ("freeze", "hibernate")
_FILE = "pause_mode"


class PauseModes:
    def __init__(self, default: str, gvisor: bool, networked: bool = False) -> None:
        self.default = default
        self.gvisor = gvisor
        self.networked = networked

    def of_spec(self, spec: Any) -> str:
        """The mode a create asks for; ``InvalidRequest`` for a bad or unsupported one."""
        extensions: dict[str, str] = getattr(spec, "extensions", None) or {}
        mode = extensions.get(PAUSE_MODE_KEY, self.default)
        if mode not in MODES:
            raise InvalidRequest(
                f"extensions[{PAUSE_MODE_KEY!r}] must be one of {', '.join(MODES)}, not {mode!r}"
            )
        if mode == "hibernate" and not self.gvisor:
            raise InvalidRequest(
                f'extensions[{PAUSE_MODE_KEY!r}] = "hibernate" needs the gVisor runtime '
                '([secure_runtime] type = "gvisor"); this server runs runc, which can only freeze'
            )
        if mode == "hibernate" and self.networked:
            raise InvalidRequest(
                f'extensions[{PAUSE_MODE_KEY!r}] = "hibernate" is not available with '
                '[network] mode = "isolated" yet (a restored sandbox would lose its outbound '
                "address)"
            )
        return mode

    @staticmethod
    def record(p: SandboxPaths, mode: str) -> None:
        (p.root / _FILE).write_text(mode)

    def recorded(self, p: SandboxPaths) -> str:
        try:
            mode = (p.root / _FILE).read_text().strip()
        except OSError:
            return self.default
        return mode if mode in MODES else self.default
