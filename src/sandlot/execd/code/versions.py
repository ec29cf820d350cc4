"""Language versions chosen with the reference image's ``*_VERSION`` variables.

The reference's code-interpreter image switches ``PATH`` (and ``JAVA_HOME``/``GOROOT``) at start
from ``PYTHON_VERSION``, ``JAVA_VERSION``, ``NODE_VERSION`` and ``GO_VERSION``, picking the highest
installed version that starts with the value; an unknown version prints "<Lang> version X not
found." and keeps the default. sandlot does the same in execd before the code service finds its
kernels, for every version the image has installed in the places Debian and the reference use:

- Python: ``/usr/bin/python3.X`` (Debian) and ``/opt/python/versions/cpython-X*`` (reference);
- Java: ``/usr/lib/jvm/java-N-openjdk-*`` (Debian and reference);
- Node.js: ``/opt/node/vN*`` (reference) besides the image's ``node``;
- Go: ``/usr/lib/go-X.Y`` (Debian) and ``/opt/go/X.Y*`` (reference).

The change is made to execd's own environment (as the reference writes it to execd's env file),
so commands see the chosen versions too.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import tempfile
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

VARIABLES = {"python": "PYTHON_VERSION", "java": "JAVA_VERSION", "node": "NODE_VERSION",
             "go": "GO_VERSION"}


@dataclass(frozen=True)
class Installed:
    version: str
    bin_dir: str
    home: str | None = None  # JAVA_HOME / GOROOT


def _version_key(version: str) -> list[int]:
    return [int(p) for p in re.findall(r"\d+", version)]


def installed(language: str, root: str = "/") -> list[Installed]:
    """The versions of ``language`` this image has, lowest first."""
    base = Path(root)
    found: list[Installed] = []
    if language == "python":
        for exe in (base / "usr/bin").glob("python3.*"):
            if re.fullmatch(r"python3\.\d+", exe.name) and os.access(exe, os.X_OK):
                found.append(Installed(exe.name[len("python"):], str(exe)))
        for home in (base / "opt/python/versions").glob("cpython-*"):
            found.append(Installed(home.name.split("-")[1], str(home / "bin")))
    elif language == "java":
        for home in (base / "usr/lib/jvm").glob("java-*-openjdk-*"):
            if (home / "bin/java").exists() and not home.is_symlink():
                found.append(Installed(home.name.split("-")[1], str(home / "bin"), str(home)))
    elif language == "node":
        for home in (base / "opt/node").glob("v*"):
            found.append(Installed(home.name[1:], str(home / "bin")))
    elif language == "go":
        for home in (base / "usr/lib").glob("go-*"):
            if (home / "bin/go").exists():
                found.append(Installed(home.name[3:], str(home / "bin"), str(home)))
        for home in (base / "opt/go").glob("*"):
            if (home / "bin/go").exists():
                found.append(Installed(home.name, str(home / "bin"), str(home)))
    return sorted(found, key=lambda i: _version_key(i.version))


def pick(language: str, wanted: str, root: str = "/") -> Installed | None:
    """The highest installed version starting with ``wanted`` (Java: the exact major), as the
    reference's switch script matches them."""
    wanted = wanted.strip().lstrip("v")
    if language == "java":
        matches = [i for i in installed(language, root) if i.version == wanted]
    else:
        matches = [i for i in installed(language, root) if i.version.startswith(wanted)]
    return matches[-1] if matches else None


def _python_shim(chosen: Installed) -> str:
    """A directory where ``python``/``python3`` are the chosen interpreter (Debian installs
    minor versions side by side in /usr/bin, with no directory of their own)."""
    if not chosen.bin_dir.endswith(f"python{chosen.version}"):
        return chosen.bin_dir
    shim = Path(tempfile.gettempdir()) / f"sandlot-python{chosen.version}-{os.getuid()}"
    shim.mkdir(mode=0o755, exist_ok=True)
    for name in ("python", "python3"):
        link = shim / name
        if not link.is_symlink():
            link.symlink_to(chosen.bin_dir)
    return str(shim)


def _is_default_python(chosen: Installed, path: str) -> bool:
    current = shutil.which("python3", path=path)
    return current is not None and os.path.realpath(current) == os.path.realpath(chosen.bin_dir)


def apply(env: MutableMapping[str, str], root: str = "/") -> dict[str, str]:
    """Switch ``env`` to the requested versions; returns language -> outcome, for logging."""
    outcome: dict[str, str] = {}
    for language, variable in VARIABLES.items():
        wanted = env.get(variable, "").strip()
        if not wanted:
            continue
        chosen = pick(language, wanted, root)
        if chosen is None:
            have = ", ".join(i.version for i in installed(language, root)) or "only the default"
            outcome[language] = f"{language} version {wanted} not found (installed: {have}); " \
                                "keeping the default"
            log.warning("%s", outcome[language])
            continue
        outcome[language] = f"{language} {chosen.version}"
        if language == "python" and _is_default_python(chosen, env.get("PATH", "")):
            continue
        bin_dir = _python_shim(chosen) if language == "python" else chosen.bin_dir
        env["PATH"] = os.pathsep.join([bin_dir, *[p for p in env.get("PATH", "").split(
            os.pathsep) if p and p != bin_dir]])
        if language == "java" and chosen.home:
            env["JAVA_HOME"] = chosen.home
        if language == "go" and chosen.home:
            env["GOROOT"] = chosen.home
        log.info("%s=%s selects %s (%s)", variable, wanted, chosen.version, bin_dir)
    return outcome
