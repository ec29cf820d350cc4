"""Run-time settings of one execd process (from its command line)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field


def default_workdir() -> str:
    return "/workspace" if os.path.isdir("/workspace") else "/"


@dataclass
class Settings:
    token: str | None = None
    # The image's User: entrypoint and commands run as it unless a request names a uid.
    default_uid: int | None = None
    default_gid: int | None = None
    workdir: str = field(default_factory=default_workdir)
    # Journals and logs of executions; a private temp dir when not given.
    state_dir: str | None = None
    # Capped log for code kernels' own stdout/stderr (code/kernelstdio.py); None: they
    # inherit execd's (only for execd run by hand: in a sandbox that is the host's log).
    kernel_log: str | None = None
    keepalive_interval: float = 15.0
    # DELETE /command: SIGINT, then SIGTERM, then SIGKILL, this many seconds apart.
    interrupt_grace: float = 3.0
    # How long a finished execution's events/logs stay readable (resume, /logs).
    retention_seconds: float = 900.0
    max_retained: int = 2000
    # Each journal of a background command (events; raw output) keeps at most about this
    # much on disk; past it the oldest part is dropped (segments.py): a command printing
    # without end does not fill the sandbox's disk through execd. ``/logs`` is how a
    # background command's output is read, so it gets the larger window.
    max_journal_bytes: int = 64 << 20
    # The same for a foreground command or session run, whose output its stream delivers:
    # its journals are a resume window and a second copy for ``/logs``. Their size is what
    # a long stream holds in the page cache (and in the sandbox's memory) per execution for
    # ``retention_seconds``, and what it fills with pages never used before: at 64 MiB
    # each, a 128 MiB stream's execd spent 6.5 ms of CPU per MiB against 2.8 at 16 MiB
    # (docs/benchmarks.md, 2026-12-04).
    max_foreground_journal_bytes: int = 16 << 20
    # After the main process exits, how long to wait for pipes still held open by
    # its daemonised descendants before ending the stream.
    drain_after_exit: float = 0.2
    metrics_interval: float = 1.0
