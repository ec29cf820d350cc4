"""Which OCI runtime binary runs the sandboxes, and what isolation that gives.

``[secure_runtime] type = "gvisor"`` means runsc and nothing else: when runsc is missing the
runtime refuses to open (and so the server to start) instead of quietly running runc.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Literal

from sandlot.config import Config
from sandlot.errors import RuntimeFailure
from sandlot.runtime.oci import cgroups

Flavor = Literal["runc", "crun", "runsc"]
RUNSC_PACKAGE_HINT = "install it (Debian/Ubuntu: apt-get install runsc) and make sure it is on PATH"


@dataclass(frozen=True)
class OciBinary:
    path: str  # resolved absolute path
    flavor: Flavor

    @property
    def isolation(self) -> str:
        """What separates a sandbox from the host kernel, as reported at start and by doctor."""
        if self.flavor == "runsc":
            return "gvisor (user-space kernel: runsc)"
        return f"{self.flavor} (Linux namespaces, cgroups, seccomp)"

    @property
    def is_gvisor(self) -> bool:
        return self.flavor == "runsc"


def flavor_of(binary: str) -> Flavor:
    name = os.path.basename(binary)
    if name.startswith("runsc"):
        return "runsc"
    if name.startswith("crun"):
        return "crun"
    return "runc"


def wanted_binary(cfg: Config) -> str:
    """The binary name the configuration asks for (not yet looked up)."""
    sr = cfg.secure_runtime
    if sr.type in ("kata", "firecracker"):
        raise RuntimeFailure(
            f'[secure_runtime] type = "{sr.type}" is not implemented by sandlot\'s oci '
            'runtime; use type = "gvisor" or remove [secure_runtime] for runc'
        )
    if sr.gvisor:
        if cfg.runtime.oci_binary and flavor_of(cfg.runtime.oci_binary) != "runsc":
            raise RuntimeFailure(
                f'[secure_runtime] type = "gvisor" needs runsc, but [runtime] oci_binary is '
                f"{cfg.runtime.oci_binary!r}; remove oci_binary or point it at runsc"
            )
        return cfg.runtime.oci_binary or "runsc"
    if cfg.runtime.oci_binary:
        return cfg.runtime.oci_binary
    if cgroups.is_unified_only() and shutil.which("crun"):
        return "crun"
    return "runc"


def choose_binary(cfg: Config) -> OciBinary:
    """The configured binary, looked up on PATH; ``RuntimeFailure`` says what is missing."""
    name = wanted_binary(cfg)
    resolved = shutil.which(name)
    if resolved is None:
        if flavor_of(name) == "runsc":
            why = ('[secure_runtime] type = "gvisor" asks for gVisor' if cfg.secure_runtime.gvisor
                   else "[runtime] oci_binary asks for runsc")
            raise RuntimeFailure(
                f"{why}, but the gVisor runtime {name!r} is not on PATH; {RUNSC_PACKAGE_HINT}. "
                "sandlot does not fall back to runc"
            )
        raise RuntimeFailure(f"OCI runtime binary {name!r} not found on PATH")
    return OciBinary(resolved, flavor_of(name))
