"""One probe of the socket families a sandbox may open, for every backend's tests.

sandlot's seccomp profile (``sandlot.runtime.oci.seccomp``) allows AF_UNIX, AF_INET,
AF_INET6 and AF_NETLINK and answers EAFNOSUPPORT to the rest; the oci and docker runtimes'
tests run this same probe in a sandbox and check its answer with ``check_families``.
"""

from __future__ import annotations

PROBE = (
    "import socket, errno\n"
    "for name, fam, typ in [('vsock', 40, 1), ('packet', 17, 3), ('alg', 38, 5),\n"
    "                       ('key', 15, 3), ('bluetooth', 31, 1), ('junk_hi', 1 << 33, 1),\n"
    "                       ('unix', 1, 1), ('inet', 2, 1), ('inet6', 10, 1),\n"
    "                       ('netlink', 16, 3)]:\n"
    "    try:\n"
    "        socket.socket(fam, typ).close()\n"
    "        print(name, 'ok')\n"
    "    except (OSError, OverflowError) as exc:\n"
    "        code = getattr(exc, 'errno', 0) or 0\n"
    "        print(name, errno.errorcode.get(code, type(exc).__name__))\n"
)
# A shell command running PROBE with the sandbox's python3.
PROBE_COMMAND = f"python3 -c \"$(cat <<'EOF'\n{PROBE}EOF\n)\""


def check_families(output: str) -> None:
    """The probe's output shows the allow list held: refused families, allowed ones open."""
    got = dict(ln.split() for ln in output.splitlines() if ln.strip())
    for refused in ("vsock", "packet", "alg", "key", "bluetooth"):
        assert got[refused] == "EAFNOSUPPORT", (refused, got)
    assert got["junk_hi"] != "ok"
    for allowed in ("unix", "inet", "inet6", "netlink"):
        assert got[allowed] == "ok", (allowed, got)
