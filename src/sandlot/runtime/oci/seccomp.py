"""The seccomp profile every sandbox runs under.

Design choice: a *deny list* over a default-allow action, not Docker's allow list. Sandboxes
run arbitrary images (any libc, any language runtime); an allow list tied to one syscall
table answers EPERM to every syscall newer than the list and breaks such software in ways
that are hard to diagnose. The dangerous surface is instead closed in layers: the calls
below are refused outright; capabilities are reduced (so mount, module loading, raw I/O and
friends already fail the kernel's own checks); no_new_privileges is set; and new user
namespaces, the usual way to regain capabilities, are refused in clone/unshare. ``clone3``
answers ENOSYS because its flags live in memory seccomp cannot inspect; libc then falls back
to ``clone``, whose flags are checked.
"""

from __future__ import annotations

import errno
from typing import Any

CLONE_NEWUSER = 0x10000000

# Socket families a workload may open: AF_UNIX (1), AF_INET (2), AF_INET6 (10) and AF_NETLINK
# (16, which ``ip`` and ``ss`` read routes and sockets through). Everything else is refused
# with EAFNOSUPPORT, as if the kernel lacked it: AF_VSOCK above all (vsock is not per network
# namespace: a sandbox would share the VM's vsock ports with the host), AF_PACKET, AF_ALG,
# AF_KEY, AF_BLUETOOTH and the rest of the rarely used, often exploited families.
ALLOWED_SOCKET_FAMILIES = (1, 2, 10, 16)
# The highest family number needing a rule of its own; from there on one ">=" rule covers
# every family, and also values with junk in the upper 32 bits (seccomp compares all 64).
_FAMILY_RULES_UP_TO = max(ALLOWED_SOCKET_FAMILIES) + 1

# Calls no sandbox workload needs and that widen the kernel attack surface or reach the host.
DENIED_SYSCALLS: tuple[str, ...] = (
    # kernel code and boot
    "kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
    "create_module", "get_kernel_syms", "query_module", "reboot",
    # file systems and mount namespace
    "mount", "umount", "umount2", "pivot_root", "mount_setattr", "move_mount", "open_tree",
    "fsopen", "fsconfig", "fsmount", "fspick", "swapon", "swapoff", "quotactl", "quotactl_fd",
    "open_by_handle_at", "name_to_handle_at", "nfsservctl", "sysfs", "ustat", "uselib",
    "_sysctl", "lookup_dcookie",
    # namespaces (entering others'; new user namespaces are handled by argument below)
    "setns",
    # kernel facilities with a long history of exploits
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "keyctl", "add_key", "request_key",
    # host-wide state
    "clock_settime", "clock_settime64", "clock_adjtime", "clock_adjtime64", "settimeofday",
    "stime", "adjtimex", "syslog", "acct", "vhangup", "iopl", "ioperm", "vm86", "vm86old",
    "kcmp", "fanotify_init",
)
# ptrace stays allowed on purpose: without CAP_SYS_PTRACE it reaches only the sandbox's own
# processes (pid namespace), and agents legitimately run strace/gdb.


def _socket_family_rules() -> list[dict[str, Any]]:
    """Deny ``socket(domain, ...)`` for every domain outside the allow list.

    One comparison per rule (libseccomp cannot AND two on the same argument): ``==`` for each
    refused family below the last allowed one, ``>=`` for all above it.
    """
    def rule(value: int, op: str) -> dict[str, Any]:
        return {"names": ["socket"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EAFNOSUPPORT,
                "args": [{"index": 0, "value": value, "op": op}]}

    refused = [f for f in range(_FAMILY_RULES_UP_TO) if f not in ALLOWED_SOCKET_FAMILIES]
    return [*(rule(f, "SCMP_CMP_EQ") for f in refused),
            rule(_FAMILY_RULES_UP_TO, "SCMP_CMP_GE")]


def seccomp_profile() -> dict[str, Any]:
    """The OCI ``linux.seccomp`` object."""
    eperm = errno.EPERM
    return {
        "defaultAction": "SCMP_ACT_ALLOW",
        # 32-bit and x32 entry points get the same rules, so they are no way around them.
        "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "syscalls": [
            {"names": list(DENIED_SYSCALLS), "action": "SCMP_ACT_ERRNO", "errnoRet": eperm},
            {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS},
            {
                "names": ["unshare"],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": eperm,
                "args": [
                    {"index": 0, "value": CLONE_NEWUSER, "valueTwo": CLONE_NEWUSER,
                     "op": "SCMP_CMP_MASKED_EQ"}
                ],
            },
            {
                "names": ["clone"],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": eperm,
                "args": [
                    {"index": 0, "value": CLONE_NEWUSER, "valueTwo": CLONE_NEWUSER,
                     "op": "SCMP_CMP_MASKED_EQ"}
                ],
            },
            *_socket_family_rules(),
        ],
    }
