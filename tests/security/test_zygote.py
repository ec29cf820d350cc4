"""The execd zygote (``[runtime] execd_launch = "zygote"``): an execd forked into a sandbox
holds exactly what runc gives an execd it starts itself, and nothing of the host.

Each test opens its runtimes with the launch it checks, whatever the configured default.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from pydantic import ValidationError

from sandlot.config import Config
from sandlot.errors import RuntimeFailure
from sandlot.images.model import Image
from sandlot.runtime.base import ContainerState
from sandlot.runtime.execd_bundle import ExecdBundle
from sandlot.runtime.oci import OciRuntime, claimops
from sandlot.runtime.oci import zygote as ocizygote
from tests.runtime.helpers import (
    EXECD_PID,
    TEST_IMAGES,
    leftovers,
    process_gone,
    runc_exec,
    spec,
    wait_ping,
)

NAMESPACES = ("net", "user", "mnt", "ipc", "uts", "cgroup", "pid")
STATUS_KEYS = ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs", "Seccomp",
               "Seccomp_filters", "Groups")
HOST_MARKER = "SANDLOT_ZYGOTE_TEST_HOST_SECRET"


def test_the_config_key_is_honoured_and_checked(tmp_path: Path) -> None:
    cfg_file = tmp_path / "c.toml"
    cfg_file.write_text('[runtime]\nexecd_launch = "exec"\n')
    cfg = Config.load(cfg_file)
    assert cfg.runtime.execd_launch == "exec"
    assert not any("execd_launch" in w for w in cfg.warnings())
    with pytest.raises(ValidationError, match="execd_launch"):
        Config.model_validate({"runtime": {"execd_launch": "vfork"}})


def test_the_waiter_keeps_execds_process_defaults() -> None:
    """runc exec takes its defaults from config.json's process: they stay execd's."""
    config = {"process": {"args": ["python3", "-m", "sandlot.execd"], "env": ["A=1"],
                          "capabilities": {"bounding": ["CAP_KILL"]}, "cwd": "/w"},
              "linux": {"seccomp": {"defaultAction": "SCMP_ACT_ALLOW"}}, "mounts": []}
    plan = ocizygote.use_waiter(config, "/usr/bin/catatonit")
    assert plan["process"]["args"][-1] == "sandlot.execd"
    assert config["process"]["args"] == [ocizygote.WAITER_PATH, "-P"]
    assert {k: v for k, v in config["process"].items() if k != "args"} == \
        {k: v for k, v in plan["process"].items() if k != "args"}
    (mount,) = config["mounts"]
    assert mount["destination"] == ocizygote.WAITER_PATH and "ro" in mount["options"]


async def test_a_host_without_its_parts_keeps_the_runc_start(
    zygote_rt: OciRuntime, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rt_image: Image
) -> None:
    assert ocizygote.unavailable_reason(zygote_rt.bundle) is None  # this host has them all
    assert "prctl.py" in (ocizygote.unavailable_reason(ExecdBundle(tmp_path)) or "")
    monkeypatch.setattr(ocizygote, "waiter_binary", lambda: None)
    rt = await open_with(zygote_rt.data_dir, "zygote")
    try:
        assert rt.zygote is None  # warned at start; sandboxes start as with "exec"
        await rt.create(spec("zy-plain", rt_image))
        await wait_ping(rt, "zy-plain")
        assert execd_pid(rt, "zy-plain") == init_pid(rt, "zy-plain")
    finally:
        await finish(rt, ["zy-plain"])


async def open_with(data_dir: Path, launch: str) -> OciRuntime:
    cfg = Config(data_dir=data_dir)
    cfg.runtime.execd_launch = launch  # type: ignore[assignment]
    cfg.runtime.warm_pool_size = 0
    rt = await OciRuntime.open(cfg, images=TEST_IMAGES)
    if not rt.user_namespaces:
        await rt.close()
        pytest.skip("the zygote serves sandboxes with a user namespace only")
    return rt


async def finish(rt: OciRuntime, ids: list[str]) -> None:
    for sid in ids:
        await rt.delete(sid)
    await rt.close()
    left = {sid: what for sid in ids if (what := leftovers(rt, sid))}
    assert not left, f"sandboxes left traces behind: {left}"


@pytest.fixture
async def zygote_rt(runtime_data_dir: Path) -> AsyncIterator[OciRuntime]:
    rt = await open_with(runtime_data_dir, "zygote")
    ids_before = await rt.list_ids()
    try:
        yield rt
    finally:
        await finish(rt, sorted(await rt.list_ids() - ids_before))


def init_pid(rt: OciRuntime, sid: str) -> int:
    return claimops.init_pid(rt.runc.root, rt.container_id(sid))


def execd_pid(rt: OciRuntime, sid: str) -> int:
    """execd's host pid: in the container's pid namespace, the lowest there running execd."""
    init = init_pid(rt, sid)
    pidns = os.readlink(f"/proc/{init}/ns/pid")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.readlink(f"/proc/{entry}/ns/pid") != pidns:
                continue
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            nspid = [ln for ln in Path(f"/proc/{entry}/status").read_text().splitlines()
                     if ln.startswith("NSpid:")][0].split()[-1]
        except (OSError, IndexError):
            continue
        if b"sandlot.execd" in cmdline:
            found.append((int(nspid), int(entry)))
    assert found, f"no execd in {sid}"
    return min(found)[1]


def status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (ln.partition(":") for ln in lines)}


def fd_kinds(pid: int, log: Path) -> list[str]:
    """execd's descriptors, by what they are (paths of the sandbox's own log normalised)."""
    kinds = []
    for fd in os.listdir(f"/proc/{pid}/fd"):
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
        kinds.append("LOG" if target == str(log) else target.split("[")[0])
    return sorted(kinds)


def limit_line(pid: int, name: str) -> str:
    return next(ln for ln in Path(f"/proc/{pid}/limits").read_text().splitlines()
                if ln.startswith(name))


async def test_forked_execd_holds_what_runc_gives_execd(
    runtime_data_dir: Path, rt_image: Image
) -> None:
    os.environ[HOST_MARKER] = "host-only"
    try:
        exec_rt = await open_with(runtime_data_dir, "exec")
        zyg_rt = await open_with(runtime_data_dir, "zygote")
    finally:
        del os.environ[HOST_MARKER]
    try:
        await exec_rt.create(spec("zy-ref", rt_image, execd_token="tok-ref"))
        await zyg_rt.create(spec("zy-fork", rt_image, execd_token="tok-fork"))
        await wait_ping(exec_rt, "zy-ref")
        await wait_ping(zyg_rt, "zy-fork")
        ref, fork = execd_pid(exec_rt, "zy-ref"), execd_pid(zyg_rt, "zy-fork")
        assert ref == init_pid(exec_rt, "zy-ref")  # runc: execd is PID 1
        init = init_pid(zyg_rt, "zy-fork")
        assert fork != init  # zygote: PID 1 is the waiter
        assert os.readlink(f"/proc/{init}/exe").endswith(ocizygote.WAITER_PATH)
        # every namespace of the container, none of the host's
        for ns in NAMESPACES:
            mine = os.readlink(f"/proc/{fork}/ns/{ns}")
            assert mine == os.readlink(f"/proc/{init}/ns/{ns}"), ns
            assert mine != os.readlink(f"/proc/self/ns/{ns}"), ns
        # the container's cgroups
        assert Path(f"/proc/{fork}/cgroup").read_text() == \
            Path(f"/proc/{init}/cgroup").read_text()
        # the same credentials, capability sets, no_new_privs and seccomp as runc's execd
        s_ref, s_fork = status(ref), status(fork)
        for key in STATUS_KEYS:
            assert s_fork[key] == s_ref[key], (key, s_fork[key], s_ref[key])
        assert s_fork["NoNewPrivs"] == "1" and s_fork["Seccomp"] == "2"
        # a session and process group of its own, as runc's execd (PID 1, which runc's init
        # made a session leader): nothing of the server's, so a signal to the server's
        # process group (Ctrl-C, kill -- -PGID, timeout) does not reach it, and no tty
        assert s_ref["NSsid"].split()[-1] == s_ref["NSpgid"].split()[-1] == "1"
        fork_nspid = s_fork["NSpid"].split()[-1]
        assert s_fork["NSsid"].split() == s_fork["NSpgid"].split() == s_fork["NSpid"].split()
        assert fork_nspid != "0"
        assert os.getsid(fork) != os.getsid(0) and os.getpgid(fork) != os.getpgrp()
        for pid in (ref, fork):
            tty_nr = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[4]
            assert tty_nr == "0", pid
        for rt, sid, st in ((exec_rt, "zy-ref", s_ref), (zyg_rt, "zy-fork", s_fork)):
            base = rt.ranges.base_of(sid)
            assert base is not None and base > 0
            assert st["Uid"].split() == [str(base)] * 4  # root of its own user namespace
            assert st["Gid"].split() == [str(base)] * 4
        assert Path(f"/proc/{fork}/oom_score_adj").read_text() == \
            Path(f"/proc/{ref}/oom_score_adj").read_text()
        assert limit_line(fork, "Max open files") == limit_line(ref, "Max open files")
        # nothing of the host open: the same kinds of descriptors as runc's execd (as sets:
        # a connection just accepted or closing adds a socket to one side at times)
        assert set(fd_kinds(fork, zyg_rt.paths("zy-fork").container_log)) == \
            set(fd_kinds(ref, exec_rt.paths("zy-ref").container_log))
        # the sandbox's root and working directory
        assert os.stat(f"/proc/{fork}/root") == os.stat(f"/proc/{init}/root")
        assert os.readlink(f"/proc/{fork}/cwd") == "/workspace"
        # no token and nothing of the server's environment in its memory's environment block
        environ = Path(f"/proc/{fork}/environ").read_bytes()
        assert b"tok-fork" not in environ and HOST_MARKER.encode() not in environ
    finally:
        await finish(exec_rt, ["zy-ref"])
        await finish(zyg_rt, ["zy-fork"])


ATTACKS = r"""
import ctypes, errno, os, sys
e = sys.argv[1]
def attempt(name, fn):
    try:
        fn()
        print(name, "ALLOWED")
    except OSError as exc:
        print(name, "refused", errno.errorcode.get(exc.errno))
attempt("exe-write", lambda: open(f"/proc/{e}/exe", "r+b"))
attempt("init-exe-write", lambda: open("/proc/1/exe", "r+b"))
attempt("bundle-loader-write", lambda: open("/opt/sandlot/lib/ld-linux-x86-64.so.2", "r+b"))
attempt("exe-read", lambda: open(f"/proc/{e}/exe", "rb"))
attempt("fd-list", lambda: os.listdir(f"/proc/{e}/fd"))
attempt("environ", lambda: open(f"/proc/{e}/environ", "rb").read())
attempt("mem", lambda: open(f"/proc/{e}/mem", "rb"))
attempt("root", lambda: os.listdir(f"/proc/{e}/root/"))
attempt("cwd", lambda: os.listdir(f"/proc/{e}/cwd/"))
libc = ctypes.CDLL(None, use_errno=True)
rc = libc.ptrace(16, int(e), 0, 0)
print("ptrace", "ALLOWED" if rc == 0 else "refused", errno.errorcode.get(ctypes.get_errno()))
"""


async def test_sandbox_cannot_reach_into_forked_execd(
    zygote_rt: OciRuntime, rt_image: Image
) -> None:
    rt = zygote_rt
    await rt.create(spec("zy-attack", rt_image))
    await wait_ping(rt, "zy-attack")
    r = runc_exec(rt, "zy-attack",
                  f"python3 -c \"$(cat <<'EOF'\n{ATTACKS}EOF\n)\" {EXECD_PID}")
    lines = dict(ln.split(" ", 1) for ln in r.stdout.splitlines())
    assert set(lines) >= {"exe-write", "init-exe-write", "bundle-loader-write", "exe-read",
                          "fd-list", "environ", "mem", "root", "cwd", "ptrace"}, r
    assert not [k for k, v in lines.items() if v.startswith("ALLOWED")], r.stdout
    await wait_ping(rt, "zy-attack")  # and execd still serves


async def test_execd_exit_stops_its_container(zygote_rt: OciRuntime, rt_image: Image) -> None:
    rt = zygote_rt
    await rt.create(spec("zy-exit", rt_image))
    await wait_ping(rt, "zy-exit")
    init = init_pid(rt, "zy-exit")
    os.kill(execd_pid(rt, "zy-exit"), signal.SIGKILL)
    assert process_gone(init), "the waiter outlived execd"
    assert (await rt.inspect("zy-exit")).state in (ContainerState.STOPPED,
                                                   ContainerState.MISSING)


async def test_failed_forked_start_leaves_nothing(
    zygote_rt: OciRuntime, rt_image: Image, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = zygote_rt
    real = ocizygote.use_waiter

    def broken(config: dict, waiter: str) -> dict:
        plan = real(config, waiter)
        plan["seccomp"] = {**plan["seccomp"], "defaultAction": "SCMP_ACT_TRACE"}
        return plan

    monkeypatch.setattr(ocizygote, "use_waiter", broken)
    with pytest.raises(RuntimeFailure, match="defaultAction"):
        await rt.create(spec("zy-fail", rt_image))
    assert not leftovers(rt, "zy-fail")
    assert "zy-fail" not in await rt.list_ids()


async def test_a_start_cut_short_is_stopped_at_the_next_open(
    zygote_rt: OciRuntime, rt_image: Image, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server killed between runc run and the zygote's answer leaves a waiter alone."""
    rt = zygote_rt
    await rt.create(spec("zy-whole", rt_image))
    await wait_ping(rt, "zy-whole")
    from sandlot.runtime import admission

    async def no_launch(*_args: object) -> int:
        return 0

    assert rt.zygote is not None
    monkeypatch.setattr(rt.zygote, "launch", no_launch)
    monkeypatch.setattr(admission, "STARTED_WAIT", 0.5)
    await rt.create(spec("zy-half", rt_image))
    half = init_pid(rt, "zy-half")

    def check(sid: str) -> bool:
        cid = rt.container_id(sid)
        return ocizygote.stop_if_half_started(rt.runc.root, cid, rt.paths(sid).config_json)

    assert not check("zy-whole")  # execd runs beside its waiter: left alone
    assert check("zy-half")
    assert process_gone(half)
    await wait_ping(rt, "zy-whole")


def _children_born_home(zygote: int) -> bool:
    """Whether the zygote's next child would be born in the zygote's own pid namespace."""
    return (os.readlink(f"/proc/{zygote}/ns/pid_for_children")
            == os.readlink(f"/proc/{zygote}/ns/pid"))


async def test_the_zygote_points_only_one_fork_into_a_sandbox(
    zygote_rt: OciRuntime, rt_image: Image, monkeypatch: pytest.MonkeyPatch
) -> None:
    """execd is born in its sandbox's pid namespace (one fork): the zygote points its
    children's pid namespace there for that fork only, also when the fork fails (the
    sandbox's PID 1 died meanwhile), and goes on serving from its own."""
    rt = zygote_rt
    await rt.create(spec("zy-home1", rt_image))
    await wait_ping(rt, "zy-home1")
    assert rt.zygote is not None
    zygote = rt.zygote.plain.pid
    assert zygote is not None and _children_born_home(zygote)
    execd = execd_pid(rt, "zy-home1")
    assert int(status(execd)["PPid"]) == zygote  # forked once, by the zygote itself
    assert os.readlink(f"/proc/{execd}/ns/pid") == \
        os.readlink(f"/proc/{init_pid(rt, 'zy-home1')}/ns/pid")

    real = ocizygote.open_launch_fds

    def init_dies_after_opening(init: int, *args: object) -> tuple[dict, list[int]]:
        opened = real(init, *args)  # type: ignore[arg-type]
        os.kill(init, signal.SIGKILL)
        assert process_gone(init)
        return opened

    monkeypatch.setattr(ocizygote, "open_launch_fds", init_dies_after_opening)
    with pytest.raises(RuntimeFailure, match="cannot fork into the sandbox"):
        await rt.create(spec("zy-dead", rt_image))
    monkeypatch.undo()
    assert rt.zygote.plain.pid == zygote and _children_born_home(zygote)
    assert not leftovers(rt, "zy-dead")
    await rt.create(spec("zy-home2", rt_image))
    await wait_ping(rt, "zy-home2")
    assert rt.zygote.plain.pid == zygote and _children_born_home(zygote)


async def test_zygote_restarts_and_closes_without_orphans(
    runtime_data_dir: Path, rt_image: Image
) -> None:
    rt = await open_with(runtime_data_dir, "zygote")
    ids = ["zy-life1", "zy-life2"]
    try:
        await rt.create(spec("zy-life1", rt_image))
        await wait_ping(rt, "zy-life1")
        assert rt.zygote is not None
        first = rt.zygote.plain.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        assert process_gone(first)
        await wait_ping(rt, "zy-life1")  # its execd belongs to the sandbox, not the zygote
        await rt.create(spec("zy-life2", rt_image))  # a new zygote serves the next start
        await wait_ping(rt, "zy-life2")
        second = rt.zygote.plain.pid
        assert second is not None and second != first
        execds = [execd_pid(rt, sid) for sid in ids]
        await rt.close()  # a server shutdown: the zygote goes, the sandboxes stay
        assert process_gone(second)
        rt = await open_with(runtime_data_dir, "zygote")  # the restarted server
        for sid in ids:
            await wait_ping(rt, sid)
    finally:
        await finish(rt, ids)
    assert all(process_gone(p) for p in execds), "execd outlived its sandbox"


async def test_the_zygote_starts_with_the_serving_runtime(
    runtime_data_dir: Path, rt_image: Image
) -> None:
    """The runtime that serves the data dir starts the zygote as it opens, so the first cold
    create does not wait for its imports; a second opener (a tool) starts none, and closing
    the serving runtime stops it."""
    rt = await open_with(runtime_data_dir, "zygote")
    try:
        assert rt.zygote is not None
        zygote = rt.zygote.plain.pid
        assert zygote is not None and not process_gone(zygote, timeout=0.1)  # before any create
        tool = await OciRuntime.open(Config(data_dir=runtime_data_dir), images=TEST_IMAGES)
        try:
            assert tool.zygote is not None and tool.zygote.plain.pid is None
            assert tool.zygote.code.pid is None
        finally:
            await tool.close()
        await rt.create(spec("zy-early", rt_image))
        await wait_ping(rt, "zy-early")
        # the first create used it
        assert (rt.zygote.plain.pid, rt.zygote.plain.starts) == (zygote, 1)
    finally:
        await finish(rt, ["zy-early"])
    assert process_gone(zygote)


def _maps_libzmq(pid: int) -> bool:
    """Whether the process has libzmq mapped: pyzmq's, which only the code service imports."""
    with open(f"/proc/{pid}/maps") as f:
        return "libzmq" in f.read()


async def test_code_images_get_their_own_zygote_and_plain_ones_none_of_its_libraries(
    runtime_data_dir: Path, rt_image: Image
) -> None:
    """A sandbox whose execd loads the code service at start (a code image's environment)
    is forked from a second zygote that has it imported, started on first use; a plain
    sandbox's execd inherits none of it (its RSS counts every page of its zygote's heap)."""
    rt = await open_with(runtime_data_dir, "zygote")
    ids = ["zy-plain", "zy-code"]
    code = None
    try:
        assert rt.zygote is not None
        plain = rt.zygote.plain.pid
        assert plain is not None and rt.zygote.code.pid is None  # not before a code image
        await rt.create(spec("zy-plain", rt_image))
        await wait_ping(rt, "zy-plain")
        assert rt.zygote.code.pid is None
        execd = execd_pid(rt, "zy-plain")
        assert int(status(execd)["PPid"]) == plain and not _maps_libzmq(execd)
        assert not _maps_libzmq(plain)

        await rt.create(spec("zy-code", rt_image, env={"SANDLOT_CODE_READY_PORT": "44790"}))
        await wait_ping(rt, "zy-code")
        code = rt.zygote.code.pid
        assert code is not None and code != plain
        assert int(status(code)["PPid"]) == plain  # forked from it: its pages are shared
        execd = execd_pid(rt, "zy-code")
        assert int(status(execd)["PPid"]) == code and _maps_libzmq(execd)
        assert (rt.zygote.plain.pid, rt.zygote.code.pid) == (plain, code)
        assert (rt.zygote.plain.starts, rt.zygote.code.starts) == (1, 1)
    finally:
        await finish(rt, ids)
    assert process_gone(plain) and code is not None and process_gone(code)  # close stops both


async def test_the_code_zygote_is_forked_again_after_it_or_its_parent_died(
    runtime_data_dir: Path, rt_image: Image
) -> None:
    """The code images' zygote ends with its parent (parent-death signal); either death is
    mended by the next code sandbox's start, and the execds already forked keep running."""
    rt = await open_with(runtime_data_dir, "zygote")
    code_env = {"SANDLOT_CODE_READY_PORT": "44790"}
    ids = ["zy-c1", "zy-c2", "zy-c3"]
    try:
        assert rt.zygote is not None
        await rt.create(spec("zy-c1", rt_image, env=code_env))
        await wait_ping(rt, "zy-c1")
        first = rt.zygote.code.pid
        assert first is not None
        os.kill(first, signal.SIGKILL)
        assert process_gone(first)
        await rt.create(spec("zy-c2", rt_image, env=code_env))  # a new fork serves it
        await wait_ping(rt, "zy-c2")
        second, plain = rt.zygote.code.pid, rt.zygote.plain.pid
        assert second is not None and second != first and plain is not None
        assert int(status(second)["PPid"]) == plain
        os.kill(plain, signal.SIGKILL)  # the parent goes: its fork goes with it
        assert process_gone(plain) and process_gone(second)
        await rt.create(spec("zy-c3", rt_image, env=code_env))
        await wait_ping(rt, "zy-c3")
        third, new_plain = rt.zygote.code.pid, rt.zygote.plain.pid
        assert third is not None and new_plain is not None and new_plain != plain
        assert int(status(third)["PPid"]) == new_plain
        assert int(status(execd_pid(rt, "zy-c3"))["PPid"]) == third
        for sid in ("zy-c1", "zy-c2"):  # their execds belong to their sandboxes
            await wait_ping(rt, sid)
    finally:
        await finish(rt, ids)
