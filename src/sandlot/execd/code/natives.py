"""Finding and starting sandlot's own Java and Go contexts (no Jupyter kernel behind them)."""

from __future__ import annotations

import os
import shutil

from .catalog import LanguageSpec
from .kernels.base import Kernel
from .kernels.golang import GoKernel
from .kernels.java import JavaKernel


def native_specs(path: str, environ: dict[str, str] | None = None) -> list[LanguageSpec]:
    """Java when a JDK's ``jshell`` and ``javac`` are there, Go when ``go`` is."""
    env = dict(os.environ) if environ is None else environ
    specs: list[LanguageSpec] = []
    java_home = env.get("JAVA_HOME", "")
    if not (java_home and os.access(os.path.join(java_home, "bin", "jshell"), os.X_OK)):
        jshell = shutil.which("jshell", path=path)
        java_home = os.path.dirname(os.path.dirname(os.path.realpath(jshell))) if jshell else ""
    if java_home and os.access(os.path.join(java_home, "bin", "javac"), os.X_OK):
        specs.append(LanguageSpec("java", "java", java_home, "Java (JShell)"))
    goroot = env.get("GOROOT", "")
    go = os.path.join(goroot, "bin", "go") if goroot else ""
    if not (go and os.access(go, os.X_OK)):
        go = shutil.which("go", path=path) or ""
    if go:
        specs.append(LanguageSpec("go", "go", go, "Go"))
    return specs


def native_kernel(spec: LanguageSpec, cwd: str | None, env: dict[str, str]) -> Kernel:
    if spec.kind == "java":
        return JavaKernel(spec.target, cwd=cwd, env=env)
    if spec.kind == "go":
        return GoKernel(spec.target, cwd=cwd, env=env)
    raise ValueError(f"{spec.language} is not a native context")
