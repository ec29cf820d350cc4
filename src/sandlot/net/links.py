"""The veth pair of a sandbox, configured over netlink (pyroute2): no ``ip`` fork per create.

The host end stays in the server's namespace with the /30's gateway address; the sandbox end
is created directly inside the sandbox namespace as ``eth0`` with the sandbox address and a
default route via the gateway. The inside is configured from a worker thread that setns()es
into the namespace and back: a netlink socket belongs to the namespace it was made in.
IPv6 is switched off inside (the default deny is written for IPv4; nothing to leak through).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import threading
from pathlib import Path

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError

from sandlot.net.addressing import SandboxAddress

CLONE_NEWNET = 0x40000000
INSIDE_IFNAME = "eth0"
_libc = ctypes.CDLL(None, use_errno=True)
_ns_lock = threading.Lock()


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns: {os.strerror(err)}")


def _write_sysctl(path: str, value: str) -> None:
    with contextlib.suppress(FileNotFoundError):  # a kernel without IPv6
        with open(path, "w") as fh:
            fh.write(value)


def _configure_inside(addr: SandboxAddress) -> None:
    with IPRoute() as ipr:
        lo = ipr.link_lookup(ifname="lo")[0]
        ipr.link("set", index=lo, state="up")
        idx = ipr.link_lookup(ifname=INSIDE_IFNAME)[0]
        ipr.addr("add", index=idx, address=str(addr.address), prefixlen=30)
        ipr.link("set", index=idx, state="up")
        ipr.route("add", dst="0.0.0.0/0", gateway=str(addr.gateway), oif=idx)
    for key in ("all", "default", INSIDE_IFNAME):
        _write_sysctl(f"/proc/sys/net/ipv6/conf/{key}/disable_ipv6", "1")


def in_netns(ns: Path, fn: object) -> None:
    """Run ``fn()`` with this thread inside namespace ``ns`` (a worker thread, never the loop)."""
    assert callable(fn)
    with _ns_lock, open(f"/proc/self/task/{threading.get_native_id()}/ns/net") as home:
        with open(ns) as target:
            _setns(target.fileno())
        try:
            fn()
        finally:
            # A thread left inside a sandbox's namespace would be a host bug: never tolerated.
            try:
                _setns(home.fileno())
            except OSError:
                os.abort()


def create_veth(addr: SandboxAddress, ns: Path) -> None:
    """Create and configure the pair (blocking: run on a worker thread)."""
    with IPRoute() as ipr, open(ns) as nsfd:
        ipr.link("add", ifname=addr.host_ifname, kind="veth",
                 peer={"ifname": INSIDE_IFNAME, "net_ns_fd": nsfd.fileno()})
        try:
            idx = ipr.link_lookup(ifname=addr.host_ifname)[0]
            _write_sysctl(f"/proc/sys/net/ipv6/conf/{addr.host_ifname}/disable_ipv6", "1")
            ipr.addr("add", index=idx, address=str(addr.gateway), prefixlen=30)
            ipr.link("set", index=idx, state="up")
            in_netns(ns, lambda: _configure_inside(addr))
        except BaseException:
            with contextlib.suppress(NetlinkError):
                ipr.link("del", ifname=addr.host_ifname)
            raise


def delete_veth(ifname: str) -> None:
    """Remove the pair by its host end; a missing one is fine."""
    with IPRoute() as ipr:
        try:
            ipr.link("del", ifname=ifname)
        except NetlinkError as exc:
            if exc.code not in (errno.ENODEV, errno.ENOENT, errno.EINVAL):
                raise


def host_links(prefix: str) -> list[str]:
    """Names of this namespace's links starting with ``prefix`` (leak checks, sweeps)."""
    with IPRoute() as ipr:
        return [name for link in ipr.get_links()
                if (name := link.get("IFLA_IFNAME") or "").startswith(prefix)]
