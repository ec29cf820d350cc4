"""Escape attempts as root in a sandbox, on every backend (issue 11: "on every backend").

test_isolation.py and test_sandbox_hardening.py go deep on oci+runc (the default); this
module runs the core attempts through a real ``sandlot serve`` of each backend (oci+runc,
oci+runsc, docker) with the released SDK: each must fail the same way everywhere.
"""

from __future__ import annotations

import secrets
import subprocess
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from opensandbox import Sandbox

from tests.compat.conftest import (  # noqa: F401
    COMPAT_IMAGE,
    SandlotServer,
    _new_server,
    compat_backend,
    compat_image_root,
)

pytestmark = pytest.mark.backends("oci", "runsc", "docker")

# One line per attempt: "<name> ok" when the attempt worked (an escape), "<name> refused".
ATTEMPTS = r"""
try() {
  name=$1; shift
  if ( "$@" ) >/dev/null 2>&1; then echo "$name ok"; else echo "$name refused"; fi
}
export A=HOSTMARK_A B=HOSTMARK_B  # the marker is "$A$B": never whole in a command line
CG=$(awk '$3 ~ /^cgroup/ {print $2}' /proc/self/mounts); export CG  # cgroup mount points
try mount mount -t tmpfs none /mnt
try unshare_user unshare -U true
try vsock python3 -c 'import socket; socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)'
try unshare_mount unshare -m true
try proc_sys sh -c 'echo 1 > /proc/sys/kernel/sysrq'
try sysrq_trigger sh -c 'echo h > /proc/sysrq-trigger'
try release_agent sh -c 'for mp in $CG; do
  [ -e "$mp/release_agent" ] && echo /x > "$mp/release_agent" && exit 0; done; exit 1'
try cgroup_mkdir sh -c 'for mp in $CG; do mkdir "$mp/escape" && exit 0; done; exit 1'
try cgroups_seen sh -c 'test -n "$CG"'
try host_file sh -c 'test -e "/proc/1/root/$A$B"'
try block_device sh -c 'mknod /tmp/sda b 8 0 && head -c 1 /tmp/sda | grep -q .'
try chroot_out sh -c 'cd /proc/1/root/.. && test -e "$A$B"'
try host_pid python3 -c 'import os, sys
m = os.environ["A"] + os.environ["B"]
me = str(os.getpid())
for p in os.listdir("/proc"):
    if p.isdigit() and p != me:
        try:
            if m in open(f"/proc/{p}/cmdline").read():
                sys.exit(0)
        except OSError:
            pass
sys.exit(1)'
"""


@pytest.fixture(scope="module")
def server(request: pytest.FixtureRequest, compat_image_root: Path,  # noqa: F811
           compat_backend: str) -> Iterator[SandlotServer]:  # noqa: F811
    srv = _new_server(request, compat_image_root, compat_backend)
    srv.start()
    try:
        yield srv
    finally:
        srv.destroy()


async def test_root_in_a_sandbox_cannot_escape(server: SandlotServer) -> None:
    marker = f"sandlot-escape-{secrets.token_hex(4)}"
    host_file = Path("/") / marker  # on the host's root: what an escape would reach
    host_file.write_text("host\n")
    # a host process whose command line names the marker: no sandbox may see it
    host_proc = subprocess.Popen(["sh", "-c", "sleep 600", marker])
    sandbox = await Sandbox.create(
        COMPAT_IMAGE, connection_config=server.sdk_config(),
        timeout=timedelta(minutes=10), ready_timeout=timedelta(seconds=120),
    )
    try:
        half = len(marker) // 2
        script = (ATTEMPTS.replace("HOSTMARK_A", marker[:half])
                  .replace("HOSTMARK_B", marker[half:]))
        assert marker not in script
        ex = await sandbox.commands.run(script)
        out = "\n".join(m.text.rstrip("\n") for m in ex.logs.stdout)
        got = dict(line.split() for line in out.splitlines() if line.strip())
        ex = await sandbox.commands.run("grep cgroup /proc/self/mountinfo; ls /sys/fs/cgroup")
        mounts = "".join(m.text for m in ex.logs.stdout)
        ex = await sandbox.commands.run("id -u")
        assert "".join(m.text for m in ex.logs.stdout).strip() == "0"  # root inside
    finally:
        await sandbox.kill()
        await sandbox.close()
        host_file.unlink()
        host_proc.kill()
        host_proc.wait()
    assert len(got) == ATTEMPTS.count("\ntry "), got
    seen = got.pop("cgroups_seen")
    if server.backend != "runsc":  # gVisor mounts no cgroup file system inside by default
        assert seen == "ok", f"{server.backend}: the cgroup attempts found no cgroup mount"
    if server.backend == "runsc":
        # gVisor answers these itself: a user namespace of its own kernel (runsc does not
        # apply sandlot's seccomp profile: docs/security.md), no host kernel surface.
        got.pop("unshare_user")
    escaped = sorted(name for name, how in got.items() if how != "refused")
    assert not escaped, f"{server.backend}: root in a sandbox could {escaped}: {got}\n{mounts}"
