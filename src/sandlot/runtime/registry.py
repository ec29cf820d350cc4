"""Which runtime backends exist: the ``sandlot.runtimes`` entry-point group.

``[runtime] type`` names one of them; an unknown name is refused with the list of known
ones. Backends shipped with sandlot are registered in its ``pyproject.toml``; other
packages add theirs under the same group. The built-in ``oci`` backend is also known when
sandlot runs from a source tree without installed metadata.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from sandlot.errors import InvalidRequest
from sandlot.runtime.base import Runtime

GROUP = "sandlot.runtimes"
_BUILTIN = {"oci": "sandlot.runtime.oci:OciRuntime"}


class UnknownRuntime(InvalidRequest):
    """``[runtime] type`` names no registered backend."""


def _targets() -> dict[str, str]:
    found = dict(_BUILTIN)
    for ep in entry_points(group=GROUP):
        found[ep.name] = ep.value
    return found


def known_runtimes() -> list[str]:
    return sorted(_targets())


def runtime_class(name: str) -> type[Runtime]:
    """The backend class registered as ``name``; ``UnknownRuntime`` lists the known ones."""
    target = _targets().get(name)
    if target is None:
        raise UnknownRuntime(
            f"unknown runtime type {name!r}; known runtime types: {', '.join(known_runtimes())}"
        )
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    cls = getattr(module, attr)
    if not (isinstance(cls, type) and issubclass(cls, Runtime)):
        raise UnknownRuntime(f"runtime type {name!r} ({target}) is not a sandlot Runtime")
    return cls
