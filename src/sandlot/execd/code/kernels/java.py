"""Java contexts: the JDK's JShell, driven through its API by :mod:`.jshellrunner`.

Why not a Java Jupyter kernel (IJava, the reference's choice): none is packaged in Debian, PyPI or
npm; the JDK's own JShell keeps every declaration, variable and import between cells. The runner
is compiled with the image's ``javac`` once per execd (about a second) into a private directory.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import tempfile
from pathlib import Path

from .base import KernelDied
from .exitwatch import returncode, watch_exit
from .jshellrunner import CLASS_NAME, SOURCE
from .pipe import PipeKernel

_compiled: dict[str, Path] = {}
_compile_lock = asyncio.Lock()


async def compiled_runner(javac: str) -> Path:
    """The directory holding the compiled runner for this ``javac`` (compiled on first use)."""
    async with _compile_lock:
        found = _compiled.get(javac)
        if found is not None and (found / f"{CLASS_NAME}.class").is_file():
            return found
        digest = hashlib.sha256((javac + SOURCE).encode()).hexdigest()[:16]
        root = Path(tempfile.gettempdir()) / f"sandlot-jshell-{os.getuid()}-{digest}"
        root.mkdir(mode=0o755, exist_ok=True)  # the runner runs as the image's user
        source = root / f"{CLASS_NAME}.java"
        source.write_text(SOURCE, encoding="utf-8")
        proc = await asyncio.create_subprocess_exec(
            javac, "-nowarn", "-XDignore.symbol.file", "-d", str(root), str(source),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        exit_status = watch_exit(proc.pid)  # execd's reaper, not asyncio, sees the status
        output, _ = await proc.communicate()
        code = returncode(exit_status, proc.returncode)
        if code != 0 or not (root / f"{CLASS_NAME}.class").is_file():
            raise KernelDied(code) from RuntimeError(output.decode(errors="replace"))
        _compiled[javac] = root
        return root


class JavaKernel(PipeKernel):
    """One JShell (its execution engine is a second JVM, which JShell starts and owns)."""

    def __init__(self, java_home: str, *, cwd: str | None, env: dict[str, str]):
        self._java_home = java_home
        java = os.path.join(java_home, "bin", "java")
        super().__init__([java], "java", cwd=cwd, env={**env, "JAVA_HOME": java_home})

    async def prepare(self) -> None:
        classes = await compiled_runner(os.path.join(self._java_home, "bin", "javac"))
        self._argv = [self._argv[0], "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                      "-Xshare:auto", "-cp", str(classes), CLASS_NAME]

    def encode_request(self, run_id: str, code: str) -> bytes:
        return f"{run_id} {base64.b64encode(code.encode()).decode()}".encode()
