"""Which languages this sandbox can run, found from the image's kernelspecs and interpreters.

execd runs on its own bundled Python, so kernels must come from the image: kernelspecs in the
image's standard Jupyter locations, ``python3 -m ipykernel_launcher`` when the image's Python has
ipykernel, and ``node`` for sandlot's native JavaScript/TypeScript context. Every spec is kept in
memory with its interpreter path made absolute, because jupyter_client would otherwise swap a bare
``python``/``python3`` for execd's own interpreter.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from jupyter_client.kernelspec import KernelSpec, KernelSpecManager, NoSuchKernel

log = logging.getLogger(__name__)

ALIASES = {
    "python3": "python", "py": "python", "ipython": "python",
    "sh": "bash", "shell": "bash",
    "js": "javascript", "node": "javascript", "nodejs": "javascript",
    "ts": "typescript",
    "golang": "go", "jshell": "java",
}


def canonical(language: str) -> str:
    lang = language.strip().lower()
    return ALIASES.get(lang, lang)


@dataclass(frozen=True)
class LanguageSpec:
    language: str
    kind: Literal["jupyter", "node", "java", "go"]
    # Jupyter: kernel name inside the resolved spec directory. Node: path of the node binary.
    # Java: the JDK's home. Go: path of the go binary.
    target: str
    display_name: str


class ResolvedSpecs(KernelSpecManager):  # type: ignore[misc]
    """Serves the resolved specs from memory (nothing written to disk, nothing to clean up)."""

    def __init__(self) -> None:
        super().__init__(ensure_native_kernel=False)
        self.resolved: dict[str, KernelSpec] = {}

    def find_kernel_specs(self) -> dict[str, str]:
        return {name: spec.resource_dir for name, spec in self.resolved.items()}

    def get_kernel_spec(self, kernel_name: str) -> KernelSpec:
        try:
            return self.resolved[kernel_name]
        except KeyError:
            raise NoSuchKernel(kernel_name) from None


class KernelCatalog:
    """Discovers language backends once and keeps the resolved kernelspecs."""

    def __init__(self, kernel_dirs: tuple[str, ...], path_env: str):
        self._dirs = kernel_dirs
        self._path = path_env
        self.specs: dict[str, LanguageSpec] = {}
        self.ksm = ResolvedSpecs()

    def discover(self, allowed: tuple[str, ...] = ()) -> dict[str, LanguageSpec]:
        specs: dict[str, LanguageSpec] = {}
        for directory in self._dirs:
            for spec_file in sorted(Path(directory).glob("*/kernel.json")):
                spec = self._adopt(spec_file)
                if spec is not None and spec.language not in specs:
                    specs[spec.language] = spec
        if "python" not in specs:
            spec = self._python_fallback()
            if spec is not None:
                specs["python"] = spec
        node = shutil.which("node", path=self._path) or shutil.which("nodejs", path=self._path)
        if node:
            specs.setdefault("javascript", LanguageSpec("javascript", "node", node, "Node.js"))
            if "typescript" not in specs and _node_has_typescript(node):
                specs["typescript"] = LanguageSpec("typescript", "node", node, "TypeScript")
        from .natives import native_specs  # natives imports this module

        for native in native_specs(self._path):
            specs.setdefault(native.language, native)
        if allowed:
            wanted = {canonical(a) for a in allowed}
            specs = {k: v for k, v in specs.items() if k in wanted}
        self.specs = specs
        return specs

    def _adopt(self, spec_file: Path) -> LanguageSpec | None:
        try:
            raw = json.loads(spec_file.read_text())
            argv = list(raw["argv"])
            language = canonical(str(raw.get("language", "")))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("skipping unreadable kernelspec %s: %s", spec_file, exc)
            return None
        if not argv or not language:
            return None
        exe = self._resolve_exe(argv[0], spec_file.parent)
        if exe is None:
            log.info("skipping kernelspec %s: %s not found", spec_file, argv[0])
            return None
        argv[0] = exe
        name = spec_file.parent.name
        self._write(name, spec_file.parent, {**raw, "argv": argv})
        return LanguageSpec(language, "jupyter", name, str(raw.get("display_name", name)))

    def _resolve_exe(self, exe: str, spec_dir: Path) -> str | None:
        if os.path.isabs(exe):
            return exe if os.access(exe, os.X_OK) else None
        is_python = exe in ("python", "python3") or exe.startswith("python3.")
        if is_python and spec_dir.resolve().is_relative_to(Path(sys.prefix).resolve()):
            return sys.executable  # a spec installed into the Python execd runs on (dev hosts)
        return shutil.which(exe, path=self._path)

    def _python_fallback(self) -> LanguageSpec | None:
        """The image's ``python3`` with ipykernel but no kernelspec file, else execd's own."""
        candidates = [shutil.which("python3", path=self._path), sys.executable]
        for exe in candidates:
            if exe and _has_ipykernel(exe):
                argv = [exe, "-m", "ipykernel_launcher", "-f", "{connection_file}"]
                body = {"argv": argv, "display_name": "Python 3", "language": "python"}
                self._write("python3", None, body)
                return LanguageSpec("python", "jupyter", "python3", "Python 3")
        return None

    def _write(self, name: str, source: Path | None, body: Mapping[str, object]) -> None:
        fields = {k: v for k, v in body.items() if k in KernelSpec.class_trait_names()}
        self.ksm.resolved[name] = KernelSpec(resource_dir=str(source or ""), **fields)


def _has_ipykernel(python: str) -> bool:
    try:
        done = subprocess.run(
            [python, "-c", "import ipykernel"], capture_output=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _node_has_typescript(node: str) -> bool:
    # The same places the runner looks (see noderunner.RUNNER).
    probe = (
        "const p=require('path');require.resolve('typescript',{paths:[process.cwd(),"
        "p.resolve(process.execPath,'..','..','lib','node_modules'),'/usr/local/lib/node_modules',"
        "...(process.env.NODE_PATH||'').split(':').filter(Boolean)]})"
    )
    try:
        done = subprocess.run([node, "-e", probe], capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0
