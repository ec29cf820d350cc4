"""A direct ``jupyter_client`` execute on a host kernel: the floor for code execution."""

from __future__ import annotations

import subprocess
import time
from typing import Any

from jupyter_client.blocking.client import BlockingKernelClient
from jupyter_client.manager import KernelManager, start_new_kernel

# What the code-interpreter image configures for its Python kernel (its recipe): the input
# history in memory, not an SQLite file committed to after every cell.
HISTORY_IN_MEMORY = ["--HistoryManager.hist_file=:memory:"]


class JupyterBaseline:
    """A host kernel as ``jupyter_client`` starts it: stock, or with ``extra_arguments``."""

    def __init__(self, extra_arguments: list[str] | None = None) -> None:
        self.km: KernelManager | None = None
        self.kc: BlockingKernelClient | None = None
        self.extra_arguments = list(extra_arguments or [])

    def start(self) -> float:
        """Start a python3 kernel and wait until it answers; seconds (the cold kernel start)."""
        t0 = time.perf_counter()
        self.km, self.kc = start_new_kernel(kernel_name="python3", startup_timeout=60,
                                            stderr=subprocess.DEVNULL,
                                            extra_arguments=self.extra_arguments)
        return time.perf_counter() - t0

    def execute(self, code: str, timeout: float = 60.0) -> tuple[float, set[str]]:
        """Run ``code``; (seconds until the kernel is idle again, MIME types it returned)."""
        assert self.kc is not None
        kc = self.kc
        mimes: set[str] = set()
        t0 = time.perf_counter()
        msg_id = kc.execute(code)
        deadline = time.monotonic() + timeout
        while True:
            msg: dict[str, Any] = kc.get_iopub_msg(timeout=max(0.1, deadline - time.monotonic()))
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg["msg_type"]
            if kind in ("execute_result", "display_data"):
                mimes.update(msg["content"].get("data", {}).keys())
            elif kind == "error":
                raise RuntimeError(f"kernel error: {msg['content'].get('evalue')}")
            elif kind == "status" and msg["content"].get("execution_state") == "idle":
                break
        return time.perf_counter() - t0, mimes

    def pid(self) -> int | None:
        """The kernel's process id (for CPU accounting), if it runs."""
        proc = getattr(self.km.provisioner, "process", None) if self.km is not None else None
        pid = getattr(proc, "pid", None)
        return pid if isinstance(pid, int) else None

    def close(self) -> None:
        if self.kc is not None:
            self.kc.stop_channels()
        if self.km is not None:
            self.km.shutdown_kernel(now=True)
        self.km = self.kc = None
