"""The steps that turn a fork of the execd zygote into a sandbox's execd (host root -> the
sandbox), in the order that keeps every step narrowing.

The plan comes from the server: the ``process`` object runc would have run execd with
(config.json: args, env, cwd, capabilities, rlimits, noNewPrivileges, oomScoreAdj) and the
container's ``linux.seccomp`` object; namespaces and cgroups come as descriptors the server
opened on the container's init process. Nothing here reads a path the sandbox can change.

Order (``fork_into`` in the zygote, ``join_cgroups`` and ``enter_sandbox`` then
``become_execd`` in its child):

1. the zygote points the pid namespace of its *children* at the sandbox's (``setns`` of a
   pid namespace never moves the caller itself), forks, and points it back at its own at
   once; the child is born in the sandbox's pid namespace, so one fork does what a fork to
   enter and a second fork inside the namespace did (a process joins a pid namespace only
   through its birth). A zygote that cannot point it back ends rather than fork again;
2. the child, still host root, outside every other namespace: non-dumpable first, joins
   the sandbox's cgroups (descriptors of ``cgroup.procs``), sets oom_score_adj and rlimits
   (lowering the one and raising the other need host privileges);
3. ``setns`` into the network namespace (made by the host, owned by the host's user
   namespace: it must be joined while we still hold host privileges), then the sandbox's
   user namespace (from here on no privilege outside it is left), then mnt, ipc, uts and
   cgroup: the namespaces runc made inside that user namespace;
4. a session of its own (as runc's init), uid/gid 0 of the user namespace, no
   supplementary groups, the exact capability sets runc gives execd (bounding, permitted,
   effective; inheritable and ambient empty), no_new_privs, the same seccomp program
   (libseccomp, from the same OCI object runc compiles), cwd, umask, environment, default
   signal dispositions, and every descriptor but stdio closed.

Between its birth and step 3 the child sits in the sandbox's pid namespace as host root:
the sandbox's processes see it there, but signalling, tracing or reading its memory needs
privileges over the host's user namespace, which nothing in a sandbox holds.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import resource
import signal
from typing import Any

import prctl
import pyseccomp

# Python 3.11 has no os.setns (3.12 does): the libc call through ctypes.
_libc = ctypes.CDLL(None, use_errno=True)
# The order the child joins namespaces in (see the module docstring); the pid namespace is
# the zygote's step (``fork_into``).
NAMESPACE_ORDER = ("net", "user", "mnt", "ipc", "uts", "cgroup")
NAMESPACES = (*NAMESPACE_ORDER, "pid")  # the descriptors a launch brings
_RLIMITS = {name: getattr(resource, name) for name in dir(resource)
            if name.startswith("RLIMIT_")}
_SECCOMP_OPS = {
    "SCMP_CMP_NE": pyseccomp.NE, "SCMP_CMP_LT": pyseccomp.LT, "SCMP_CMP_LE": pyseccomp.LE,
    "SCMP_CMP_EQ": pyseccomp.EQ, "SCMP_CMP_GE": pyseccomp.GE, "SCMP_CMP_GT": pyseccomp.GT,
    "SCMP_CMP_MASKED_EQ": pyseccomp.MASKED_EQ,
}
_SECCOMP_ARCHES = {"SCMP_ARCH_X86_64": "X86_64", "SCMP_ARCH_X86": "X86",
                   "SCMP_ARCH_X32": "X32", "SCMP_ARCH_AARCH64": "AARCH64",
                   "SCMP_ARCH_ARM": "ARM"}


class ConfineError(Exception):
    """A step of the confinement failed: the child must not run execd."""


def setns(fd: int, what: str) -> None:
    if _libc.setns(fd, 0) != 0:
        err = ctypes.get_errno()
        raise ConfineError(f"setns({what}): {os.strerror(err)}")


def _action(rule: dict[str, Any]) -> Any:
    action = rule.get("action", "SCMP_ACT_ERRNO")
    if action == "SCMP_ACT_ERRNO":
        return pyseccomp.ERRNO(int(rule.get("errnoRet", errno.EPERM)))
    if action == "SCMP_ACT_ALLOW":
        return pyseccomp.ALLOW
    if action == "SCMP_ACT_KILL":
        return pyseccomp.KILL
    raise ConfineError(f"seccomp action {action} is not supported by the zygote")


def seccomp_filter(profile: dict[str, Any]) -> Any:
    """A libseccomp filter of the OCI ``linux.seccomp`` object (what runc builds from it)."""
    default = profile.get("defaultAction", "SCMP_ACT_ALLOW")
    if default != "SCMP_ACT_ALLOW":
        raise ConfineError(f"seccomp defaultAction {default} is not supported by the zygote")
    filt = pyseccomp.SyscallFilter(defaction=pyseccomp.ALLOW)
    for arch in profile.get("architectures", []):
        name = _SECCOMP_ARCHES.get(arch)
        if name is None:
            raise ConfineError(f"seccomp architecture {arch} is not supported by the zygote")
        with contextlib.suppress(Exception):  # the native one is already there
            filt.add_arch(getattr(pyseccomp.Arch, name))
    for rule in profile.get("syscalls", []):
        args = []
        for a in rule.get("args") or []:
            op = _SECCOMP_OPS[a["op"]]
            if op == pyseccomp.MASKED_EQ:
                args.append(pyseccomp.Arg(a["index"], op, a["value"], a.get("valueTwo", 0)))
            else:
                args.append(pyseccomp.Arg(a["index"], op, a["value"]))
        for name in rule["names"]:
            try:
                filt.add_rule(_action(rule), name, *args)
            except (RuntimeError, ValueError, OSError):
                continue  # unknown to this libseccomp/architecture: runc skips them too
    return filt


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2
_BPF_INSN = 8  # bytes per classic BPF instruction


class CompiledFilter:
    """A libseccomp filter compiled once (``export_bpf``) and loaded as the kernel takes it.

    libseccomp's own ``load`` generates the program from its rule database every time: ~1 MB
    of heap written in each forked execd. The zygote compiles it once; each execd passes the
    same (shared) bytes to ``prctl(PR_SET_SECCOMP)``, which is what ``seccomp_load`` ends in
    for a filter with no load flags. Hand-written because libseccomp has no call that loads
    an exported program.
    """

    def __init__(self, program: bytes, no_new_privs: bool) -> None:
        if not program or len(program) % _BPF_INSN:
            raise ConfineError("libseccomp exported an empty or partial program")
        self.program = ctypes.create_string_buffer(program, len(program))
        self.length = len(program) // _BPF_INSN
        self.no_new_privs = no_new_privs

    @classmethod
    def of(cls, filt: Any) -> CompiledFilter | None:
        """The compiled ``filt``; None if it needs what ``prctl`` cannot do (thread sync,
        logging, speculative-store flags): then only libseccomp can load it."""
        attr = pyseccomp.Attr
        if any(filt.get_attr(a) for a in (attr.CTL_TSYNC, attr.CTL_LOG, attr.CTL_SSB)):
            return None
        read_end, write_end = os.pipe()
        with os.fdopen(read_end, "rb") as reader, os.fdopen(write_end, "wb") as writer:
            filt.export_bpf(writer)  # a few KiB: fits the pipe's buffer
            writer.close()
            program = reader.read()
        return cls(program, bool(filt.get_attr(attr.CTL_NNP)))

    def load(self) -> None:
        if self.no_new_privs:  # as libseccomp does before loading (its default attribute)
            prctl.set_no_new_privs(True)
        prog = _SockFprog(self.length, ctypes.addressof(self.program))
        if _libc.prctl(ctypes.c_int(PR_SET_SECCOMP), ctypes.c_ulong(SECCOMP_MODE_FILTER),
                       ctypes.byref(prog), ctypes.c_ulong(0), ctypes.c_ulong(0)) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"loading the seccomp program: {os.strerror(err)}")


def fork_into(pid_ns: int, home: int) -> int:
    """Step 1: ``os.fork()`` with the child born in the pid namespace ``pid_ns``; the
    caller's children's pid namespace is pointed back at ``home`` (the caller's own) before
    this returns in the parent. If that fails the caller is ended (exit status 70): any
    child it forked next would be born in the sandbox."""
    setns(pid_ns, "pid")
    try:
        pid = os.fork()
    except BaseException:
        _home(home)
        raise
    if pid:
        _home(home)
    return pid


def _home(home: int) -> None:
    try:
        setns(home, "pid")
    except ConfineError as exc:
        os.write(2, f"execd zygote: {exc}; ending\n".encode())
        os._exit(70)


def join_cgroups(cgroup_fds: list[int]) -> None:
    """Step 2's start: non-dumpable, then into the sandbox's cgroups (its memory, from here
    on, is charged to the sandbox)."""
    prctl.set_dumpable(False)
    me = str(os.getpid()).encode()  # as the pid namespace we are in numbers us
    for fd in cgroup_fds:
        os.write(fd, me)


def enter_sandbox(plan: dict[str, Any], ns_fds: dict[str, int]) -> None:
    """Steps 2 (after ``join_cgroups``) and 3 (see the module docstring)."""
    prctl.set_dumpable(False)
    process = plan["process"]
    adj = process.get("oomScoreAdj")
    if adj is not None:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write(str(int(adj)))
    for limit in process.get("rlimits", []):
        resource.setrlimit(_RLIMITS[limit["type"]], (limit["soft"], limit["hard"]))
    for name in NAMESPACE_ORDER:
        setns(ns_fds[name], name)
    prctl.set_dumpable(False)  # joining the user namespace reset it


def become_execd(plan: dict[str, Any], seccomp: Any) -> None:
    """Step 4: everything runc does to execd before exec, minus the exec."""
    process = plan["process"]
    # A session of its own, as runc's init has (it calls setsid): otherwise execd stays in
    # the server's session and process group, so a signal to that group (Ctrl-C on
    # ``sandlot serve``, ``kill -- -PGID`` of the job that started it, coreutils timeout)
    # would end every sandbox's execd, and a server started on a terminal would lend
    # execd that terminal as its controlling tty.
    os.setsid()
    user = process.get("user", {})
    uid, gid = int(user.get("uid", 0)), int(user.get("gid", 0))
    os.setgroups([int(g) for g in user.get("additionalGids", [])])
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    caps = process.get("capabilities", {})
    bounding = [_cap_number(n) for n in caps.get("bounding", [])]
    prctl.capbset.limit(*bounding)
    for number in range(max(prctl.ALL_CAPS) + 1, 64):  # newer than python-prctl knows
        with contextlib.suppress(OSError, ValueError):
            prctl.capbset_drop(number)
    # effective before permitted: effective must stay a subset of permitted at every step
    prctl.cap_effective.limit(*(_cap_number(n) for n in caps.get("effective", [])))
    prctl.cap_permitted.limit(*(_cap_number(n) for n in caps.get("permitted", [])))
    prctl.cap_inheritable.limit(*(_cap_number(n) for n in caps.get("inheritable", [])))
    if process.get("noNewPrivileges"):
        prctl.set_no_new_privs(True)
    prctl.set_dumpable(False)  # the uid change reset it
    os.chdir(process.get("cwd") or "/")
    os.umask(0o022)
    os.environ.clear()
    for item in process.get("env", []):
        key, sep, value = item.partition("=")
        if sep:
            os.environ[key] = value
    # As in a fresh interpreter (SIGPIPE stays ignored, as Python sets it at start-up).
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.set_wakeup_fd(-1)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    if seccomp is not None:
        seccomp.load()  # last: the program refuses setns, mount and friends


def _cap_number(name: str) -> int:
    value = getattr(prctl, name.upper(), None)
    if not isinstance(value, int):
        raise ConfineError(f"unknown capability {name}")
    return value
