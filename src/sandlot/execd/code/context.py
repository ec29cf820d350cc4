"""A code context: one kernel plus what the service tracks about it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from .kernels.base import Kernel


@dataclass
class CodeContext:
    id: str
    language: str
    cwd: str | None
    kernel: Kernel | None
    # One run at a time per context; a run meanwhile is refused (see CodeService._execute).
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    running: str | None = None  # the execution id currently in the kernel

    def public(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language}
