"""config.json generation: hardening, limits and the execd start line (no runc needed)."""

from __future__ import annotations

from pathlib import Path

from sandlot.images.model import Image, ImageConfig
from sandlot.runtime.base import ImageRef, SandboxSpec
from sandlot.runtime.execd_bundle import ExecdBundle
from sandlot.runtime.oci.seccomp import DENIED_SYSCALLS
from sandlot.runtime.oci.spec import build_config

IMAGE = Image(name="t", id="t", lower_dirs=[Path("/nonexistent")],
              config=ImageConfig(env=["PATH=/custom/bin", "LANG=C.UTF-8"], working_dir="/app"))


def _config(**kw: object) -> dict:
    spec = SandboxSpec(sandbox_id="abc", image=ImageRef("t"), entrypoint=["python", "app.py"],
                       **kw)  # type: ignore[arg-type]
    return build_config(spec, IMAGE, ExecdBundle(Path("/b")), netns=Path("/run/netns/x"),
                        etc_dir=Path("/d/etc"), swap_limit=True, execd_port=44772)


def test_process_starts_execd_from_bundle_then_entrypoint() -> None:
    c = _config(env={"LANG": "de_DE.UTF-8"}, execd_token="tok")
    args = c["process"]["args"]
    assert args[:3] == ["/opt/sandlot/lib/ld-linux-x86-64.so.2", "--library-path",
                        "/opt/sandlot/lib"]
    # TCP on the sandbox's own loopback: no socket file the workload could swap for a link
    assert args[args.index("--listen") + 1] == "tcp:127.0.0.1:44772"
    assert args[args.index("--workdir") + 1] == "/app"
    assert args[-3:] == ["--", "python", "app.py"]
    env = dict(e.split("=", 1) for e in c["process"]["env"])
    assert env["PATH"] == "/custom/bin" and env["LANG"] == "de_DE.UTF-8"
    assert "tok" not in env.values()  # it reaches execd through stdin, not the environment
    assert "--token-stdin" in args
    private = env["SANDLOT_EXECD_PRIVATE_ENV"].split(",")
    assert {"PYTHONHOME", "PYTHONPATH"} <= set(private)
    assert c["process"]["noNewPrivileges"] is True
    assert c["hostname"] == "abc"


def test_no_entrypoint_means_no_separator() -> None:
    spec = SandboxSpec(sandbox_id="abc", image=ImageRef("t"), entrypoint=[])
    c = build_config(spec, IMAGE, ExecdBundle(Path("/b")), netns=Path("/n"),
                     etc_dir=Path("/e"), swap_limit=False, execd_port=44772)
    assert "--" not in c["process"]["args"]
    assert "memory" not in c["linux"]["resources"]


def test_hardening() -> None:
    c = _config()
    caps = c["process"]["capabilities"]
    for kind in ("bounding", "effective", "permitted"):
        assert "CAP_NET_RAW" not in caps[kind] and "CAP_MKNOD" not in caps[kind]
        assert "CAP_SYS_ADMIN" not in caps[kind]
    ns = {n["type"]: n.get("path") for n in c["linux"]["namespaces"]}
    assert set(ns) == {"pid", "ipc", "uts", "mount", "cgroup", "network"}
    assert ns["network"] == "/run/netns/x"
    for p in ("/proc/kcore", "/proc/keys", "/proc/timer_list", "/sys/firmware"):
        assert p in c["linux"]["maskedPaths"]
    assert "/proc/sys" in c["linux"]["readonlyPaths"]
    mounts = {m["destination"]: m for m in c["mounts"]}
    assert "ro" in mounts["/sys"]["options"] and "ro" in mounts["/sys/fs/cgroup"]["options"]
    bundle = mounts["/opt/sandlot"]
    assert bundle["source"] == "/b" and {"ro", "nosuid", "nodev"} <= set(bundle["options"])
    # no writable host directory inside the sandbox (issue 11 finding 2)
    assert mounts["/run/sandlot"]["type"] == "tmpfs"
    host_binds = [m for m in c["mounts"] if m["type"] == "bind" and "rw" in m["options"]]
    assert {m["destination"] for m in host_binds} == {"/etc/hosts", "/etc/hostname"}


def test_seccomp_denies_the_required_calls() -> None:
    sc = _config()["linux"]["seccomp"]
    denied = set(DENIED_SYSCALLS)
    for name in ("kexec_load", "init_module", "mount", "umount2", "pivot_root", "swapon",
                 "reboot", "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key",
                 "request_key", "open_by_handle_at", "setns", "io_uring_setup",
                 "clock_settime", "syslog", "acct", "quotactl"):
        assert name in denied, name
    rules = {tuple(r["names"]): r for r in sc["syscalls"]}
    assert rules[("unshare",)]["args"][0]["value"] == 0x10000000
    assert rules[("clone3",)]["errnoRet"] == 38  # ENOSYS: libc falls back to clone


def test_limits() -> None:
    r = _config(memory_bytes=1 << 30, cpu_cores=1.5, pids_limit=99)["linux"]["resources"]
    assert r["memory"] == {"limit": 1 << 30, "swap": 1 << 30}
    assert r["cpu"] == {"quota": 150_000, "period": 100_000}
    assert r["pids"] == {"limit": 99}
