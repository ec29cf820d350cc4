"""Issue 11 findings 1 and 2: the host-side holes in the server's way into a sandbox.

Each test plays the attacker against a real ``sandlot serve``: a workload (root inside its
sandbox) that tries to point the server at a host socket, and an unprivileged host user
who tries to read the data dir, the database and the execd tokens.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import pwd
import shlex
import shutil
import socket
import sqlite3
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from sandlot.config import Config
from tests.compat.conftest import COMPAT_IMAGE, SandlotServer, _in_thread
from tests.runtime.helpers import line_of, stream_event

PROBE_USER = "sandlot-probe"


@pytest.fixture(scope="module")
def server(compat_image_root: Path) -> Iterator[SandlotServer]:
    srv = SandlotServer(compat_image_root)
    srv.start()
    try:
        yield srv
    finally:
        srv.destroy()


def _create(srv: SandlotServer) -> str:
    with srv.client() as c:
        r = c.post("/v1/sandboxes", json={"image": {"uri": COMPAT_IMAGE}, "timeout": 600,
                                          "entrypoint": ["tail", "-f", "/dev/null"]})
        assert r.status_code == 202, r.text
        sid = r.json()["id"]
        for _ in range(600):
            state = c.get(f"/v1/sandboxes/{sid}").json()["status"]["state"]
            if state == "Running":
                return str(sid)
            assert state == "Pending", state
            time.sleep(0.05)
    raise AssertionError(f"sandbox {sid} never became Running")


def _container_id(srv: SandlotServer, sid: str) -> str:
    async def lookup() -> str:
        from sandlot.runtime.oci import OciRuntime

        rt = await OciRuntime.open(Config(data_dir=srv.data_dir))
        try:
            return rt.container_id(sid)
        finally:
            await rt.close()

    return str(_in_thread(lookup()))


def _in_sandbox(srv: SandlotServer, sid: str, script: str) -> subprocess.CompletedProcess[str]:
    """``sh -c script`` as root inside the sandbox, with its workload's process settings:
    started by execd (reached through the server proxy), as the workload's commands are.
    (Not ``runc exec``: runc 1.1 cannot join a user-namespaced sandbox's host-owned network
    namespace.)"""
    out, err, code = [], [], -1
    with srv.client() as c:
        ep = c.get(f"/v1/sandboxes/{sid}/endpoints/44772",
                   params={"use_server_proxy": "true"}).json()
        body = {"command": f"sh -c {shlex.quote(script)}", "timeout": 60000}
        with c.stream("POST", f"http://{ep['endpoint']}/command", json=body,
                      headers=ep.get("headers") or {}, timeout=60) as r:
            for line in r.iter_lines():
                event = stream_event(line)
                if event is None:
                    continue
                if event.get("type") == "stdout":
                    out.append(line_of(event))
                elif event.get("type") == "stderr":
                    err.append(line_of(event))
                elif event.get("type") == "execution_complete":
                    code = int(event.get("exit_code") or 0)
    return subprocess.CompletedProcess(["sh", "-c", script], code, "".join(out), "".join(err))


class _HostSocket:
    """A root-only host UNIX socket (stands for docker.sock): counts who reaches it."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="sl-evil-", dir="/tmp"))
        self.path = self.dir / "host.sock"
        self.hits = 0
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(self.path))
        os.chmod(self.path, 0o600)
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.hits += 1
            with conn:
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nPWNED!")

    def close(self) -> None:
        self._stop = True
        self.sock.close()
        self._thread.join(5)
        self.path.unlink(missing_ok=True)
        self.dir.rmdir()


def test_a_workload_cannot_point_the_server_at_a_host_socket(server: SandlotServer) -> None:
    """Finding 2: the workload swaps execd's socket for a symlink to a host socket; the
    server's proxy, direct endpoint and readiness path must still reach execd, never the
    host socket (which on the host could be docker.sock: host root)."""
    evil = _HostSocket()
    sid = _create(server)
    try:
        r = _in_sandbox(server, sid, "mkdir -p /run/sandlot; "
                        f"rm -rf /run/sandlot/execd.sock; ln -s {evil.path} "
                        "/run/sandlot/execd.sock && echo planted")
        assert r.returncode == 0 and "planted" in r.stdout, r.stderr
        with server.client() as c:
            ep = c.get(f"/v1/sandboxes/{sid}/endpoints/44772").json()
            token = ep["headers"]["X-EXECD-ACCESS-TOKEN"]
            # through the server proxy
            proxied = c.post(f"/v1/sandboxes/{sid}/proxy/44772/command",
                             json={"command": "echo from-execd"},
                             headers={"X-EXECD-ACCESS-TOKEN": token})
            assert proxied.status_code == 200, proxied.text
            assert "from-execd" in proxied.text and "PWNED" not in proxied.text
            ping = c.get(f"/v1/sandboxes/{sid}/proxy/44772/ping")
            assert ping.status_code == 200 and "PWNED" not in ping.text
        # through the direct endpoint
        direct = httpx.get(f"http://{ep['endpoint']}/ping", timeout=10)
        assert direct.status_code == 200 and "PWNED" not in direct.text
        # a new sandbox's readiness probe after the plant still finds its own execd
        assert _create(server)
        assert evil.hits == 0
        # nothing the sandbox writes lies in the server's way: no host dir is bound rw
        mounts = _in_sandbox(server, sid, "cat /proc/self/mountinfo").stdout
        run_line = next(ln for ln in mounts.splitlines() if ln.split()[4] == "/run/sandlot")
        assert " - tmpfs " in run_line
    finally:
        evil.close()
        server.delete_all_sandboxes()


def _probe_user() -> str:
    try:
        pwd.getpwnam(PROBE_USER)
    except KeyError:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        PROBE_USER], check=True, capture_output=True)
    return PROBE_USER


def _as_probe_user(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["runuser", "-u", _probe_user(), "--", *argv],
                          capture_output=True, text=True, timeout=30)


def test_other_host_users_cannot_read_tokens_or_the_database(server: SandlotServer) -> None:
    """Finding 1: an unprivileged host user reading the data dir or the database must learn
    no execd token; the server keeps none it can recompute."""
    sid = _create(server)
    try:
        with server.client() as c:
            token = c.get(f"/v1/sandboxes/{sid}/endpoints/44772").json()["headers"][
                "X-EXECD-ACCESS-TOKEN"]
        data = server.data_dir
        db = data / "sandlot.db"
        secret = data / "server.secret"
        assert stat.S_IMODE(data.stat().st_mode) == 0o700
        assert stat.S_IMODE(db.stat().st_mode) == 0o600
        assert stat.S_IMODE(secret.stat().st_mode) == 0o600
        for path in (db, secret, data):
            r = _as_probe_user("cat" if path.is_file() else "ls", str(path))
            assert r.returncode != 0 and "Permission denied" in r.stderr, (path, r)
        # Even with the database in hand: no token in it (it is derived from the secret).
        rows = sqlite3.connect(f"file:{db}?mode=ro", uri=True).execute(
            "SELECT id, execd_token FROM sandboxes").fetchall()
        assert (sid, "") in rows
        assert all(token not in str(row) for row in rows)
        mac = hmac.new(secret.read_bytes(), b"execd-token:" + sid.encode(), hashlib.sha256)
        assert token == base64.urlsafe_b64encode(mac.digest()).rstrip(b"=").decode()
    finally:
        server.delete_all_sandboxes()


def test_tokens_survive_a_restart(compat_image_root: Path) -> None:
    srv = SandlotServer(compat_image_root)
    srv.start()
    try:
        sid = _create(srv)
        with srv.client() as c:
            before = c.get(f"/v1/sandboxes/{sid}/endpoints/44772").json()
        srv.stop()
        srv.start()
        with srv.client() as c:
            after = c.get(f"/v1/sandboxes/{sid}/endpoints/44772").json()
            assert after["headers"] == before["headers"]
            r = c.post(f"/v1/sandboxes/{sid}/proxy/44772/command", json={"command": "true"},
                       headers=after["headers"])
            assert r.status_code == 200, r.text
    finally:
        srv.destroy()


def test_serve_refuses_a_data_dir_other_users_can_reach(compat_image_root: Path) -> None:
    srv = SandlotServer(compat_image_root)
    try:
        os.chmod(srv.data_dir, 0o755)
        with pytest.raises(RuntimeError) as err:
            srv.start(timeout=120)
        srv.proc = None  # it exited
        assert "chmod 700" in str(err.value) and str(srv.data_dir) in str(err.value)
        assert not (srv.data_dir / "sandlot.db").exists()
    finally:
        os.chmod(srv.data_dir, 0o700)
        srv.destroy()


def test_a_new_data_dir_is_created_root_only() -> None:
    from sandlot import datadir

    parent = Path(tempfile.mkdtemp(prefix="sl-open-", dir="/tmp"))
    try:
        os.chmod(parent, 0o755)  # everyone may traverse to it: only its own mode protects it
        target = parent / "data" / "sandlot"
        datadir.prepare(target)
        assert stat.S_IMODE(target.stat().st_mode) == 0o700
        r = _as_probe_user("ls", str(target))
        assert r.returncode != 0 and "Permission denied" in r.stderr
    finally:
        shutil.rmtree(parent)
