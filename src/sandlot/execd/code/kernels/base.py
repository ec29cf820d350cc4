"""What every kind of kernel (Jupyter or sandlot's native Node context) offers the service.

Kernels report output as neutral :class:`Output` items; turning them into the contract's SSE
events (and capping their size) is the service's job, so each backend stays small.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

OutputKind = Literal["stdout", "stderr", "result", "error", "count"]


@dataclass
class Output:
    kind: OutputKind
    text: str = ""
    data: dict[str, Any] = field(default_factory=dict)
    ename: str = ""
    evalue: str = ""
    traceback: list[str] = field(default_factory=list)
    count: int | None = None


Emit = Callable[[Output], None]


class KernelDied(Exception):
    """The kernel process exited while (or before) running code."""

    def __init__(self, returncode: int | None):
        self.returncode = returncode
        super().__init__(f"kernel exited ({describe_exit(returncode)})")

    @property
    def killed(self) -> bool:
        return self.returncode == -signal.SIGKILL


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "exit status unknown"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


class Kernel(Protocol):
    """One live interpreter holding a context's state."""

    language: str

    @property
    def pid(self) -> int | None: ...

    async def start(self, timeout: float) -> None: ...

    async def execute(self, code: str, emit: Emit) -> None:
        """Run ``code`` to completion, reporting output through ``emit``.

        Raises :class:`KernelDied` when the process goes away mid-run.
        """
        ...

    async def interrupt(self) -> None: ...

    async def is_alive(self) -> bool: ...

    async def shutdown(self) -> None: ...
