"""The principal a request acts for, kept in a context variable for the request's duration.

Set once by the authentication middleware (``auth.py``); the services read it where they
look a resource up (``visible``) or make one (``owner_of_new``). Work outside any request
(start-up reconciliation, expiry timers, pool refills) runs as ``SYSTEM``, which sees all,
as does the admin. Tasks a request starts inherit its principal (asyncio copies the context),
so a tenant's background build acts as that tenant.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from sandlot.errors import Forbidden


@dataclass(frozen=True)
class Quota:
    """A tenant's budget over its live sandboxes; None: no bound on that axis."""

    sandboxes: int | None = None
    cpu: float | None = None  # cores, summed over the sandboxes' cpu limits
    memory: int | None = None  # bytes, summed over the sandboxes' memory limits


@dataclass(frozen=True)
class Principal:
    """A tenant (``admin=False``; owns what it creates) or an administrator (sees all)."""

    name: str
    admin: bool = False
    quota: Quota = field(default_factory=Quota)
    namespace: str | None = None  # the reference's Kubernetes namespace, kept for display

    @property
    def owner(self) -> str | None:
        """The owner recorded on what this principal creates (None: the default tenant)."""
        return None if self.admin else self.name

    def may_see(self, owner: str | None) -> bool:
        return self.admin or owner == self.name


ADMIN = Principal("admin", admin=True)
SYSTEM = Principal("system", admin=True)
# Requests to the public paths (/health, /version): owns and sees nothing (no tenant can be
# named "": names are checked by the tenants file's parser).
ANONYMOUS = Principal("")

_current: ContextVar[Principal] = ContextVar("sandlot_principal", default=SYSTEM)


def current() -> Principal:
    return _current.get()


@contextmanager
def acting_as(principal: Principal) -> Iterator[Principal]:
    token = _current.set(principal)
    try:
        yield principal
    finally:
        _current.reset(token)


def visible(owner: str | None) -> bool:
    """Whether the current principal may see a resource owned by ``owner``."""
    return _current.get().may_see(owner)


def owner_of_new() -> str | None:
    return _current.get().owner


def require_admin(what: str) -> None:
    """Platform-wide operations (pools) are the administrator's; 403 for tenants (the
    resource is shared and listed to every tenant, so refusing leaks nothing)."""
    if not _current.get().admin:
        raise Forbidden(f"{what} is an administrator's operation: pools are shared by all "
                        "tenants (tenants may list them and create sandboxes from them)",
                        code="ADMIN_ONLY")
