"""What runsc (gVisor) needs beyond the runc command line sandlot already speaks.

Network: runsc runs with its own network stack (``--network=sandbox``, netstack), so a
sandbox's sockets live inside gVisor, not in the Linux network namespace. netstack takes
over every non-loopback interface of the sandbox's namespace at start, so the host reaches
ports inside through a veth pair whose sandbox end (``gv0``, ``GVISOR_ADDR``) gVisor owns and
whose other end sits in a second, per-sandbox *access* namespace (``<netns>-a``) that only
the server enters (``connect`` setns()es there and dials ``GVISOR_ADDR``). Nothing is added
to the host's own namespace. netstack (unlike ``--network=host``) can be checkpointed,
which hibernation needs.

The Debian runsc build (2022) refuses ``--network=sandbox`` on Linux >= 6.x: it decides
"this is the root network namespace" by the presence of ``/proc/sys/net/core/rmem_default``,
which newer kernels show in every namespace. ``run``/``restore`` are therefore started in a
private mount namespace (``unshare``) where ``/proc/sys/net`` is covered by an empty tmpfs;
the namespace given to runsc is always the sandbox's own, never the host's.

execd listens on TCP inside gVisor on loopback and on ``GVISOR_ADDR``; the server reaches
it, like any port, through the access namespace.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path

from sandlot.errors import RuntimeFailure
from sandlot.runtime.hosttools import run_tool
from sandlot.runtime.oci import netns

GVISOR_ADDR = "198.19.255.254"  # the sandbox end, owned by netstack (RFC 2544 test range)
ACCESS_ADDR = "198.19.255.253"  # the access namespace's end
PREFIX = 30
SANDBOX_LINK = "gv0"
ACCESS_LINK = "gva"
ACCESS_SUFFIX = "-a"


# Host threads of an idle sandbox (sentry, gofer, platform stubs) and per guest process,
# measured with the ptrace platform: ~80 and ~9 (systrap: ~27 and ~3; the limit then lets
# more guest processes through, and still stops a fork bomb).
PIDS_BASE = 256
PIDS_PER_PROCESS = 10


def host_pids_limit(guest_limit: int) -> int:
    """``pids.max`` for a gVisor sandbox's host cgroup.

    Guest processes are not host processes under gVisor: the host cgroup counts the
    sentry's threads and ptrace stubs. The limit is scaled so that a fork bomb inside is
    stopped on the host; the guest's exact process count is not enforced by this runsc.
    """
    return PIDS_BASE + PIDS_PER_PROCESS * guest_limit


def global_args(platform: str) -> list[str]:
    # Not --oci-seccomp (the sentry would apply config.json's seccomp profile to the
    # workload): with it execd cannot prepare a hibernation (it never answers the quiesce
    # signal; so on Debian's 2022 runsc and on the 2024 one of bookworm-backports).
    # The calls it would refuse reach gVisor's kernel, not the host's (docs/security.md).
    # --overlay2=none: the sandbox writes its rootfs through to the host's overlay (its upper
    # dir), as under runc: snapshots copy it and the disk limit counts it. gVisor >= 2023
    # otherwise keeps the writes in an overlay of its own (``root:self``: a filestore file
    # the host cannot read as files); Debian bookworm's 2022 build has no overlay by default.
    return [f"--platform={platform}", "--network=sandbox", "--overlay2=none"]


@dataclass(frozen=True)
class SaveOptions:
    """The fastest ``checkpoint``/``restore`` flags of one runsc build.

    gVisor since 2023 can write the memory uncompressed into a pages file of its own
    (``--compression=none``) with ``O_DIRECT`` (``--direct``: no copy of the image left in
    the host's page cache) and read it back the same way; Debian bookworm's 2022 build knows
    neither and always compresses (seconds for 256 MiB). ``version`` is the build's
    ``runsc --version``: its images are readable by that build only.
    """

    version: str
    checkpoint: tuple[str, ...] = ()
    restore: tuple[str, ...] = ()


_FLAG = re.compile(r"^\s+-([\w-]+)", re.MULTILINE)
_help_cache: dict[tuple[str, int], tuple[str, frozenset[str], frozenset[str]]] = {}


async def _flags_of(binary: str) -> tuple[str, frozenset[str], frozenset[str]]:
    """(version, checkpoint flags, restore flags), read once per binary file."""
    try:
        key = (binary, os.stat(binary).st_mtime_ns)  # a package upgrade replaces the file
    except OSError:
        key = (binary, 0)
    if key not in _help_cache:
        version = await run_tool([binary, "--version"])
        ckpt = await run_tool([binary, "help", "checkpoint"])
        rest = await run_tool([binary, "help", "restore"])
        lines = version.stdout.decode(errors="replace").splitlines()
        _help_cache[key] = (lines[0].strip() if lines else "",
                            frozenset(_FLAG.findall(ckpt.stdout.decode(errors="replace"))),
                            frozenset(_FLAG.findall(rest.stdout.decode(errors="replace"))))
    return _help_cache[key]


def direct_io_works(directory: Path) -> bool:
    """Whether files in ``directory`` open with ``O_DIRECT`` (tmpfs before Linux 6.6 refuses)."""
    probe = directory / ".direct-probe"
    try:
        fd = os.open(probe, os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o600)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            return False
        raise
    os.close(fd)
    probe.unlink(missing_ok=True)
    return True


async def save_options(binary: str, image_dir: Path) -> SaveOptions:
    """What to pass ``binary``'s checkpoint and restore for an image in ``image_dir``."""
    version, ckpt, rest = await _flags_of(binary)
    direct = ("direct" in ckpt or "direct" in rest) and direct_io_works(image_dir)
    checkpoint: list[str] = []
    if "compression" in ckpt:
        checkpoint.append("--compression=none")
    if direct and "direct" in ckpt:
        checkpoint.append("--direct")
    restore = ["--direct"] if direct and "direct" in rest else []
    return SaveOptions(version, tuple(checkpoint), tuple(restore))


async def resolve_platform(binary: str, wanted: str) -> str:
    """``[runtime] runsc_platform`` for ``binary``: "auto" is systrap when it has it (faster
    than ptrace at everything, a restore from hibernation ~2x), else ptrace; a named platform
    the build lacks is refused rather than left to fail at the first start."""
    res = await run_tool([binary, "help", "platforms"])
    known = set(res.stdout.decode(errors="replace").split())
    if wanted == "auto":
        return "systrap" if "systrap" in known else "ptrace"
    if known and wanted not in known:
        raise RuntimeFailure(f"[runtime] runsc_platform = {wanted!r}: {binary} offers only "
                             f"{', '.join(sorted(known))}")
    return wanted


def with_netns_check_hidden(argv: list[str]) -> list[str]:
    """``argv`` run where ``/proc/sys/net`` is empty (see module docstring)."""
    return ["unshare", "--mount", "--propagation", "slave", "sh", "-c",
            'mount -t tmpfs -o size=4k,mode=0555 sandlot-hide /proc/sys/net && exec "$@"',
            "sh", *argv]


def access_netns_name(sandbox_netns: str) -> str:
    return sandbox_netns + ACCESS_SUFFIX


async def _ip(*args: str) -> None:
    res = await run_tool(["ip", *args])
    if not res.ok:
        msg = res.stderr.decode(errors="replace").strip()
        raise RuntimeFailure(f"ip {' '.join(args)} failed: {msg}")


async def create_access(sandbox_netns: str) -> Path:
    """The access namespace and the veth pair into the sandbox's namespace."""
    access = access_netns_name(sandbox_netns)
    path = await netns.create_netns(access)
    try:
        await _ip("-n", sandbox_netns, "link", "add", SANDBOX_LINK, "type", "veth",
                  "peer", "name", ACCESS_LINK, "netns", access)
        await _ip("-n", access, "addr", "add", f"{ACCESS_ADDR}/{PREFIX}", "dev", ACCESS_LINK)
        await _ip("-n", access, "link", "set", ACCESS_LINK, "up")
        await _ip("-n", sandbox_netns, "link", "set", SANDBOX_LINK, "up")
        await address_sandbox_link(sandbox_netns)
    except BaseException:
        await netns.delete_netns(access)
        raise
    return path


async def address_sandbox_link(sandbox_netns: str) -> None:
    """(Re-)address ``gv0`` before ``run``/``restore``: netstack copies the address from
    the namespace and removes it there, so a restore finds none."""
    await _ip("-n", sandbox_netns, "addr", "replace", f"{GVISOR_ADDR}/{PREFIX}",
              "dev", SANDBOX_LINK)


async def delete_access(sandbox_netns: str) -> None:
    """Remove the access namespace (its veth end goes with it, and the peer with that)."""
    await netns.delete_netns(access_netns_name(sandbox_netns))


def state_files(root: Path, container_id: str) -> list[Path]:
    """runsc keeps ``<sandbox>_sandbox:<container>.{state,lock}`` files, not runc's dirs."""
    if not root.is_dir():
        return []
    return [p for p in root.iterdir() if p.name.endswith((f"_sandbox:{container_id}.state",
                                                          f"_sandbox:{container_id}.lock"))]


def container_ids(root: Path) -> set[str]:
    if not root.is_dir():
        return set()
    return {p.name.rsplit("_sandbox:", 1)[1][: -len(".state")]
            for p in root.iterdir() if p.name.endswith(".state") and "_sandbox:" in p.name}
