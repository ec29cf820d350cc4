"""``sandlot doctor``: what on this host works for sandlot, and how to fix what does not.

Every check is real (it runs a tiny container, mounts an overlay in the data dir, makes a
network namespace and a veth pair) and cleans up after itself. Checks the configured runtime
needs are *required*: if one fails, doctor exits 1, as ``sandlot serve`` would refuse or fail.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sandlot import datadir, hostfs
from sandlot.config import Config
from sandlot.errors import RuntimeFailure
from sandlot.net import hostmode
from sandlot.runtime.oci import cgroups, mounts, runsc
from sandlot.runtime.oci.binary import RUNSC_PACKAGE_HINT, choose_binary, flavor_of

MIN_FREE_BYTES = 2 << 30
TOOL_TIMEOUT = 60.0


@dataclass
class Check:
    name: str
    ok: bool | None  # None: not applicable / informational
    detail: str
    fix: str = ""
    required: bool = False


def _run(argv: list[str], timeout: float = TOOL_TIMEOUT) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError as exc:
        return subprocess.CompletedProcess(argv, 127, "", f"{argv[0]}: {exc.strerror}")
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, -9, "", f"timed out after {timeout:.0f}s")


def _err(res: subprocess.CompletedProcess[str]) -> str:
    text = (res.stderr or res.stdout or "").strip().splitlines()
    return text[-1][:300] if text else f"exit status {res.returncode}"


def _tiny_bundle(root: Path, netns: Path | None) -> Path:
    """A bundle whose rootfs is empty but for the host's /usr, /bin, /lib* bound read-only."""
    bundle = root / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    binds = [d for d in ("/usr", "/bin", "/lib", "/lib64") if Path(d).exists()]
    namespaces: list[dict[str, str]] = [{"type": t} for t in ("pid", "ipc", "uts", "mount")]
    namespaces.append({"type": "network", **({"path": str(netns)} if netns else {})})
    config = {
        "ociVersion": "1.0.2",
        "process": {"terminal": False, "user": {"uid": 0, "gid": 0}, "cwd": "/",
                    "args": ["/bin/sh", "-c", "echo sandlot-doctor-ok; uname -r"],
                    "env": ["PATH=/usr/bin:/bin"], "noNewPrivileges": True},
        "root": {"path": "rootfs", "readonly": True},
        "hostname": "doctor",
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"},
                   *({"destination": d, "type": "bind", "source": d,
                      "options": ["rbind", "ro"]} for d in binds)],
        "linux": {"namespaces": namespaces},
    }
    (bundle / "config.json").write_text(json.dumps(config))
    return bundle


def _container_check(binary: str, required: bool) -> Check:
    flavor = flavor_of(binary)
    name = f"{flavor} runs a container"
    path = shutil.which(binary)
    if path is None:
        fix = (RUNSC_PACKAGE_HINT if flavor == "runsc"
               else f"install {binary} (Debian/Ubuntu: apt-get install {binary})")
        return Check(name, False if required else None, f"{binary} is not on PATH", fix, required)
    version = _run([path, "--version"]).stdout.splitlines()[:1]
    tmp = Path(tempfile.mkdtemp(prefix="sldoctor"))
    ns_name = f"sandlot-doctor-{secrets.token_hex(3)}"
    cid = f"sandlot-doctor-{secrets.token_hex(4)}"
    try:
        argv = [path, "--root", str(tmp / "state")]
        netns = None
        if flavor == "runsc":
            # As sandlot runs it: netstack in a namespace of its own, behind the check hider.
            if _run(["ip", "netns", "add", ns_name]).returncode != 0:
                return Check(name, False, "cannot create a network namespace",
                             "run as root with iproute2 installed", required)
            netns = Path("/run/netns", ns_name)
            argv += runsc.global_args("ptrace")
        bundle = _tiny_bundle(tmp, netns)
        argv += ["run", "--bundle", str(bundle), cid]
        res = _run(runsc.with_netns_check_hidden(argv) if flavor == "runsc" else argv)
        if res.returncode != 0 or "sandlot-doctor-ok" not in res.stdout:
            return Check(name, False, f"{path}: {_err(res)}",
                         "run sandlot as root on a host with namespaces and cgroups", required)
        kernel = res.stdout.split("sandlot-doctor-ok", 1)[1].strip()
        return Check(name, True, f"{path} ({' '.join(version)}); kernel inside: {kernel}",
                     required=required)
    finally:
        _run([path, "--root", str(tmp / "state"), "delete", "--force", cid])
        _run(["ip", "netns", "delete", ns_name])
        shutil.rmtree(tmp, ignore_errors=True)


def check_runtimes(cfg: Config) -> list[Check]:
    checks = []
    try:
        configured = choose_binary(cfg).path if cfg.runtime.type == "oci" else None
        config_error = None
    except RuntimeFailure as exc:
        configured, config_error = None, exc.message
    wants_gvisor = cfg.secure_runtime.gvisor and cfg.runtime.type == "oci"
    oci = cfg.runtime.type == "oci"
    checks.append(_container_check("runc", required=oci and not wants_gvisor
                                   and (configured is None or flavor_of(configured) == "runc")))
    checks.append(_container_check(cfg.runtime.oci_binary if wants_gvisor
                                   and cfg.runtime.oci_binary else "runsc",
                                   required=wants_gvisor))
    if config_error:
        checks.append(Check("configured OCI runtime", False, config_error,
                            "fix [runtime]/[secure_runtime] in the config file", required=oci))
    elif configured:
        checks.append(Check("configured OCI runtime", True, configured, required=oci))
    kvm = Path("/dev/kvm")
    checks.append(Check("/dev/kvm (gVisor kvm platform)", None,
                        "present" if kvm.exists() else "absent",
                        "" if kvm.exists() else "gVisor uses the ptrace platform (the default)"))
    return checks


def check_cgroups() -> Check:
    mounts_ = cgroups.cgroup_mounts()
    if not mounts_:
        return Check("cgroups", False, "no cgroup file system mounted",
                     "mount cgroup2 on /sys/fs/cgroup (or boot with systemd)", required=True)
    if cgroups.is_unified_only():
        ctrl = Path("/sys/fs/cgroup/cgroup.controllers").read_text().split()
        layout, missing = "v2 (unified)", [c for c in ("cpu", "memory", "pids") if c not in ctrl]
    else:
        names = {m.name for m in mounts_}
        layout = "v1 + v2 (hybrid)" if "unified" in names else "v1"
        missing = [c for c in ("cpu", "memory", "pids", "freezer") if c not in names]
    memsw = Path("/sys/fs/cgroup/memory/memory.memsw.limit_in_bytes").exists()
    detail = f"{layout}; swap accounting {'on' if memsw or cgroups.is_unified_only() else 'off'}"
    if missing:
        return Check("cgroups", False, f"{detail}; missing controllers: {', '.join(missing)}",
                     "enable the controllers (kernel cmdline / systemd)", required=True)
    return Check("cgroups", True, detail, required=True)


def check_overlay(data_dir: Path) -> Check:
    if "overlay" not in Path("/proc/filesystems").read_text():
        return Check("overlayfs", False, "the kernel has no overlay file system",
                     "modprobe overlay", required=True)
    try:
        datadir.create(data_dir)  # 0700: serve would refuse a 0755 one made here
        tmp = Path(tempfile.mkdtemp(prefix=".doctor-", dir=data_dir))
    except OSError as exc:
        return Check("overlayfs", False, f"cannot write {data_dir}: {exc}",
                     "create the data dir, writable by root", required=True)
    try:
        dirs = [tmp / n for n in ("lower", "upper", "work", "merged")]
        for d in dirs:
            d.mkdir()
        (dirs[0] / "f").write_text("x")
        mounts.mount_overlay([dirs[0]], dirs[1], dirs[2], dirs[3])
        try:
            (dirs[3] / "g").write_text("y")
        finally:
            mounts.unmount(dirs[3])
        return Check("overlayfs", True, f"mounts with its upper dir in {data_dir}", required=True)
    except OSError as exc:
        return Check("overlayfs", False, f"overlay in {data_dir}: {exc}",
                     "put data_dir on ext4/xfs (not on overlay, tmpfs is fine)", required=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_userns() -> Check:
    limit = Path("/proc/sys/user/max_user_namespaces")
    value = limit.read_text().strip() if limit.exists() else "0"
    res = _run(["unshare", "--user", "--map-root-user", "true"])
    if value == "0" or res.returncode != 0:
        return Check("user namespaces", False, f"max_user_namespaces={value}; {_err(res)}",
                     "sysctl -w user.max_user_namespaces=15000 (gVisor's sandbox uses one)")
    return Check("user namespaces", True, f"available (max_user_namespaces={value})")


def check_network() -> list[Check]:
    checks = []
    nft = _run(["nft", "list", "tables"])
    checks.append(Check("nftables", nft.returncode == 0,
                        "nft works" if nft.returncode == 0 else _err(nft),
                        "" if nft.returncode == 0 else "apt-get install nftables; run as root"))
    ns = f"sandlot-doctor-{secrets.token_hex(3)}"
    steps = [["ip", "netns", "add", ns], ["ip", "-n", ns, "link", "set", "lo", "up"],
             ["ip", "-n", ns, "link", "add", "dv0", "type", "veth", "peer", "name", "dv1"]]
    failed = None
    try:
        for argv in steps:
            res = _run(argv)
            if res.returncode != 0:
                failed = f"{' '.join(argv[:4])}: {_err(res)}"
                break
    finally:
        _run(["ip", "netns", "delete", ns])
    checks.append(Check("network namespaces and veth", failed is None,
                        failed or "ip netns and veth pairs work",
                        "" if failed is None else "install iproute2; run as root", required=True))
    fwd = Path("/proc/sys/net/ipv4/ip_forward").read_text().strip()
    checks.append(Check("IPv4 forwarding", None, f"net.ipv4.ip_forward={fwd}",
                        "" if fwd == "1" else "sandboxes with outbound access need it on"))
    return checks


def check_network_mode(cfg: Config) -> Check | None:
    """Mode host is unfenced: said loudly here as at every start (sandlot.net.hostmode)."""
    if cfg.network.mode != "host":
        return None
    why = hostmode.refusal(cfg)
    if why:
        return Check("network mode host", False, why, "use isolated (the default)",
                     required=True)
    return Check("network mode host", False, "WARNING: " + hostmode.WARNING,
                 'set [network] mode = "isolated" unless every workload is trusted')


def check_docker(cfg: Config) -> Check | None:
    wanted = cfg.runtime.type == "docker" or cfg.secure_runtime.docker_runtime is not None
    if not wanted:
        return None
    try:
        import docker

        client = docker.from_env(timeout=10)
        info = client.info()
        client.close()
    except Exception as exc:  # noqa: BLE001 - any failure means "not reachable"
        return Check("Docker engine", False, f"not reachable: {exc}",
                     "start dockerd or set DOCKER_HOST", required=cfg.runtime.type == "docker")
    runtimes = sorted(info.get("Runtimes", {}))
    want = cfg.secure_runtime.docker_runtime
    if cfg.secure_runtime.gvisor and want and want not in runtimes:
        return Check("Docker engine", False,
                     f"engine {info.get('ServerVersion')} has no runtime {want!r} "
                     f"(has: {', '.join(runtimes)})",
                     f"runsc install --runtime {want} && systemctl restart docker",
                     required=cfg.runtime.type == "docker")
    return Check("Docker engine", True, f"engine {info.get('ServerVersion')}; runtimes: "
                 f"{', '.join(runtimes)}", required=cfg.runtime.type == "docker")


def check_kubernetes(cfg: Config) -> list[Check] | None:
    """Cluster access and permissions (``sandlot.runtime.kubernetes.checks``)."""
    if cfg.runtime.type != "kubernetes":
        return None
    import asyncio

    from sandlot.runtime.kubernetes.checks import cluster_findings

    return [Check(f.name, f.ok, f.detail, f.fix, required=f.required)
            for f in asyncio.run(cluster_findings(cfg))]


def _nearest_existing(data_dir: Path) -> Path:
    """The data dir, or its nearest existing parent (doctor may run before the first start)."""
    return data_dir if data_dir.exists() else next(
        (p for p in data_dir.parents if p.exists()), Path("/"))


def check_data_dir(data_dir: Path) -> Check:
    probe = _nearest_existing(data_dir)
    st = os.statvfs(probe)
    free = st.f_bavail * st.f_frsize
    fstype, best = "?", ""
    with open("/proc/self/mounts") as fh:
        for line in fh:
            parts = line.split()
            mp = parts[1]
            if str(probe.resolve()).startswith(mp) and len(mp) > len(best):
                best, fstype = mp, parts[2]
    detail = f"{data_dir} on {fstype} ({best}); {free / (1 << 30):.1f} GiB free"
    if free < MIN_FREE_BYTES:
        return Check("data dir", False, detail, "free space or move data_dir (>= 2 GiB)",
                     required=True)
    return Check("data dir", True, detail, required=True)


def check_data_dir_journal(data_dir: Path) -> Check | None:
    """A warning when the data dir is on ext4 without a journal (``sandlot.hostfs``)."""
    device = hostfs.ext4_without_journal(_nearest_existing(data_dir))
    if device is None:
        return None
    return Check("data dir journal", False, hostfs.journal_advice(data_dir, device),
                 hostfs.JOURNAL_FIX)


def run_checks(cfg: Config) -> list[Check]:
    steps: list[Callable[[], Check | list[Check] | None]] = [
        lambda: check_runtimes(cfg), check_cgroups, lambda: check_overlay(cfg.data_dir),
        check_userns, check_network, lambda: check_network_mode(cfg),
        lambda: check_docker(cfg), lambda: check_kubernetes(cfg),
        lambda: check_data_dir(cfg.data_dir), lambda: check_data_dir_journal(cfg.data_dir),
    ]
    checks: list[Check] = []
    for step in steps:
        found = step()
        if isinstance(found, list):
            checks += found
        elif found is not None:
            checks.append(found)
    return checks


def render(checks: list[Check], cfg: Config, console: Console) -> None:
    kind = cfg.runtime.type + (f" + {cfg.secure_runtime.type}" if cfg.secure_runtime.type
                               else "")
    table = Table(title=f"sandlot doctor (configured runtime: {kind})")
    for col in ("check", "status", "detail", "fix"):
        table.add_column(col, overflow="fold")
    for c in checks:
        status = ("[green]ok[/]" if c.ok else "[yellow]info[/]" if c.ok is None
                  else "[red]FAIL[/]" if c.required else "[yellow]warn[/]")
        # escaped: details name config keys such as [kubernetes] (not rich markup)
        table.add_row(c.name + (" *" if c.required else ""), status, escape(c.detail),
                      escape(c.fix))
    console.print(table)
    console.print("* needed by the configured runtime")


def exit_status(checks: list[Check]) -> int:
    return 1 if any(c.required and c.ok is False for c in checks) else 0
