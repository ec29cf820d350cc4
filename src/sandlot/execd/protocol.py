"""execd's wire constants, shared by execd and by the host-side client (``execd_client``).

Standard library only: the server imports it without pulling in execd's dependencies.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

DEFAULT_PORT = 44772
TOKEN_HEADER = "X-EXECD-ACCESS-TOKEN"
PING_PATH = "/ping"
CLAIM_PATH = "/_sandlot/claim"  # a pooled execd's one-time hand-over (execd/claim.py)
# Where execd takes client connections the host hands over whole (execd/handoff.py): a
# datagram socket in the abstract namespace of the sandbox's own network namespace.
HANDOFF_ADDRESS = b"\0sandlot-execd-handoff"
# Where the sandbox's entrypoint output goes (a tmpfs of the sandbox's own, every backend).
ENTRYPOINT_LOG = "/run/sandlot/entrypoint.log"
# Where Jupyter code kernels' own stdout and stderr go (execd/code/kernelstdio.py): beside
# the entrypoint's log; the server's diagnostics show it after the entrypoint's output.
KERNEL_LOG = "/run/sandlot/kernels.log"

# The last line execd appends to the entrypoint's log when it ends; the server's diagnostics
# look for it (``parse_entrypoint_exit``).
ENTRYPOINT_EXIT_PREFIX = "[sandlot] entrypoint "


def entrypoint_exit_line(wait_status: int) -> str:
    """``[sandlot] entrypoint exited with code N`` or ``... was killed by signal N (NAME)``."""
    if os.WIFSIGNALED(wait_status):
        num = os.WTERMSIG(wait_status)
        try:
            name = signal.Signals(num).name
        except ValueError:
            name = "unknown"
        return f"{ENTRYPOINT_EXIT_PREFIX}was killed by signal {num} ({name})\n"
    code = os.WEXITSTATUS(wait_status) if os.WIFEXITED(wait_status) else 255
    return f"{ENTRYPOINT_EXIT_PREFIX}exited with code {code}\n"


def parse_entrypoint_exit(log_tail: str) -> str | None:
    """The entrypoint's end as execd logged it (``exited with code 3``), or None."""
    for line in reversed(log_tail.splitlines()):
        if line.startswith(ENTRYPOINT_EXIT_PREFIX):
            return line[len(ENTRYPOINT_EXIT_PREFIX):].strip()
    return None


# Set in images made for code (the code-interpreter recipe): clients such as the
# code-interpreter SDK wait for the readiness port the code service opens, so execd loads it
# right away there, and the server forks such an execd from the zygote that has it imported.
CODE_IMAGE_ENV = ("JUPYTER_PORT", "SANDLOT_CODE_READY_PORT", "SANDLOT_CODE_PRESTART")


def code_at_start(environ: Mapping[str, str]) -> bool:
    """Does execd load the code service at start (a code image), or on the first ``/code``?"""
    return any(environ.get(name, "").strip() for name in CODE_IMAGE_ENV)


# The request that has the execd zygote fork the code images' zygote (``execd/zygote.py``,
# ``Zygote.spawn_code_zygote``): a message no launch header (a JSON object) can be.
SPAWN_CODE_ZYGOTE = b"spawn-code-zygote"
