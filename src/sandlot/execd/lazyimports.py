"""Import ``ssl``, ``hashlib``, ``hmac`` and ``http.client`` only when something really uses them.

execd never speaks TLS, yet asyncio and uvicorn import ``ssl`` and starlette imports
``hashlib`` and ``secrets`` (hence ``hmac``) at start-up; each loads and initialises OpenSSL,
~4.5 MB of a ~30 MB daemon that runs in every sandbox. Starlette also imports ``http.client``
(and with it most of the ``email`` package, ~0.5 MB) for its table of reason phrases.
``install()`` (called before those imports) puts a stand-in module under each name. A stand-in
carries the few attributes its importers read while they are imported or on execd's own paths
(constants, classes used in ``isinstance`` and ``except`` checks that cannot match before the
real module exists, ``hmac.compare_digest``, ``http.client.responses``) and imports the real
module on the first access of anything else, e.g. when the code service's libraries import
(jupyter_client, tornado, zmq) or a route hashes something. Then the stand-in takes all the
real module's attributes (modules holding the stand-in see real values), ``sys.modules``
holds the real module, and module globals bound to stand-in classes (``from ssl import
SSLContext``, ``asyncio.sslproto.SSLAgainErrors``) are pointed at the real classes.
"""

from __future__ import annotations

import importlib
import sys
import threading
from _operator import _compare_digest
from collections.abc import Callable, Mapping
from http import HTTPStatus
from types import ModuleType
from typing import Any

_lock = threading.RLock()
_unloaded: set[ModuleType] = set()  # stand-ins whose real module is not imported yet


def _stand_in_class(name: str, *bases: type) -> type:
    """A class no object is an instance of until the real module replaces it."""
    return type(name, bases or (object,), {"__module__": __name__, "__doc__": "stand-in"})


def _ssl_presets() -> dict[str, Any]:
    ssl_error = _stand_in_class("SSLError", OSError)
    return {
        # uvicorn/config.py: default arguments of Config (equal to the real IntEnum values)
        "PROTOCOL_TLS_SERVER": 17,
        "CERT_NONE": 0,
        # asyncio/sslproto.py: SSLAgainErrors = (ssl.SSLWantReadError, ssl.SSLSyscallError)
        "SSLError": ssl_error,
        "SSLWantReadError": _stand_in_class("SSLWantReadError", ssl_error),
        "SSLSyscallError": _stand_in_class("SSLSyscallError", ssl_error),
        # asyncio/base_events.py: _check_ssl_socket's isinstance(sock, ssl.SSLSocket)
        "SSLSocket": _stand_in_class("SSLSocket"),
        # anyio/streams/tls.py (imported with anyio's asyncio backend): from ssl import SSLContext
        "SSLContext": _stand_in_class("SSLContext"),
    }


# name -> attributes its stand-in answers without importing the real module
DEFERRED: dict[str, Callable[[], dict[str, Any]]] = {
    "ssl": _ssl_presets,
    "hashlib": dict,  # starlette.responses: import hashlib (used by FileResponse's etag)
    # secrets: from hmac import compare_digest (the same C function hmac falls back to)
    "hmac": lambda: {"compare_digest": _compare_digest},
    # starlette.exceptions: http.client.responses.get(status_code, "") (as http.client builds it)
    "http.client": lambda: {"responses": {s: s.phrase for s in HTTPStatus.__members__.values()}},
    # uvicorn.config: import logging.config (used only for a log_config, which execd leaves
    # unset: main sets up logging itself)
    "logging.config": dict,
}


def install(names: Mapping[str, Callable[[], dict[str, Any]]] = DEFERRED) -> list[str]:
    """Put stand-ins in ``sys.modules`` for those of ``names`` not imported yet; returns them."""
    installed = []
    for name, presets in names.items():
        if name not in sys.modules:
            module = sys.modules[name] = stand_in(name, presets())
            parent, _, child = name.rpartition(".")
            if parent:  # as the import system does: ``import http.client`` reads http.client
                setattr(importlib.import_module(parent), child, module)
            installed.append(name)
    return installed


def is_stand_in(module: object) -> bool:
    """True while ``module`` is a stand-in whose real module has not been imported."""
    return isinstance(module, ModuleType) and module in _unloaded


def stand_in(name: str, presets: Mapping[str, Any]) -> ModuleType:
    """A module named ``name`` holding ``presets``; any other attribute imports the real one."""
    module = ModuleType(name, f"Stand-in for {name}, imported on first use (see {__name__}).")
    module.__dict__.update(presets)

    def __getattr__(attr: str) -> Any:  # noqa: N807 - the module __getattr__ hook (PEP 562)
        if attr.startswith("__") and attr.endswith("__") and attr != "__all__":
            # Probes such as inspect.getmodule's hasattr(module, "__file__") import nothing.
            raise AttributeError(f"module {name!r} has no attribute {attr!r}")
        return getattr(_load(module), attr)

    module.__dict__["__getattr__"] = __getattr__
    _unloaded.add(module)
    return module


def _load(module: ModuleType) -> ModuleType:
    """Import the real module behind the stand-in ``module`` and make the stand-in mirror it."""
    name = module.__name__
    with _lock:
        if module not in _unloaded:  # another thread got here first
            return sys.modules.get(name, module)
        if sys.modules.get(name) is module:
            del sys.modules[name]
        try:
            real = importlib.import_module(name)
        except BaseException:
            sys.modules.setdefault(name, module)
            raise
        own = vars(module)
        # stand-in class -> real class (the stand-ins are kept alive by this mapping)
        classes = {
            id(value): (value, getattr(real, key))
            for key, value in own.items()
            if isinstance(value, type) and value.__module__ == __name__ and hasattr(real, key)
        }
        del own["__getattr__"]
        own.update(vars(real))
        _unloaded.discard(module)
        _repoint(classes)
        return real


def _repoint(classes: dict[int, tuple[type, Any]]) -> None:
    """Module globals (and tuples of them) bound to stand-in classes get the real classes."""

    def real(value: Any) -> Any:
        pair = classes.get(id(value))
        return pair[1] if pair is not None and pair[0] is value else value

    for mod in list(sys.modules.values()):
        if not isinstance(mod, ModuleType):
            continue
        namespace = mod.__dict__
        for key, value in list(namespace.items()):
            if isinstance(value, type) and real(value) is not value:
                namespace[key] = real(value)
            elif type(value) is tuple and any(real(v) is not v for v in value):
                namespace[key] = tuple(real(v) for v in value)
