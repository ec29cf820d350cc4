"""``docker run -d`` + ``docker exec`` on a private dockerd: what a reference-server user gets.

The harness starts its own ``dockerd`` (data root, exec root and socket under a temp dir; no
bridge, no iptables, so the host network is untouched), imports the same rootfs as an image
with the API's ``fromSrc`` import (no registry), and talks to the Engine API over the unix
socket as docker-py does (no CLI start-up cost in the figures). Stopped and removed afterwards.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
from tests.docker_engine import stop_dockerd

IMAGE = "sandlot-bench-base:latest"


class DockerUnavailable(RuntimeError):
    pass


class DockerBaseline:
    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.sock = workdir / "docker.sock"
        self.proc: subprocess.Popen[bytes] | None = None
        self.client: httpx.Client | None = None
        self.containers: set[str] = set()

    @staticmethod
    def available() -> str | None:
        """None if a dockerd can be started here, else why not."""
        if shutil.which("dockerd") is None:
            return "dockerd not installed (make bench installs docker.io)"
        return None

    def start(self, timeout: float = 60.0) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        log = open(self.workdir / "dockerd.log", "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(
            ["dockerd", "--data-root", str(self.workdir / "root"),
             "--exec-root", str(self.workdir / "exec"), "--host", f"unix://{self.sock}",
             "--pidfile", str(self.workdir / "docker.pid"), "--bridge", "none",
             "--iptables=false", "--ip6tables=false", "--ip-masq=false"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self.client = httpx.Client(transport=httpx.HTTPTransport(uds=str(self.sock)),
                                   base_url="http://docker", timeout=120.0)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise DockerUnavailable(f"dockerd exited with {self.proc.returncode}")
            with contextlib.suppress(httpx.HTTPError):
                if self.client.get("/_ping").status_code == 200:
                    return
            time.sleep(0.2)
        raise DockerUnavailable(f"dockerd did not answer in {timeout:.0f}s")

    def _api(self) -> httpx.Client:
        if self.client is None:
            raise DockerUnavailable("dockerd not started")
        return self.client

    def import_rootfs(self, rootfs: Path) -> float:
        """Import ``rootfs`` as IMAGE (a tar streamed to the Engine API); seconds taken."""
        t0 = time.perf_counter()
        r = self._api().post("/images/create", params={"fromSrc": "-", "repo": IMAGE.split(":")[0],
                                                       "tag": "latest"},
                             content=_tar_stream(rootfs),
                             headers={"Content-Type": "application/x-tar"}, timeout=600.0)
        r.raise_for_status()
        if "error" in r.text.lower() and '"errorDetail"' in r.text:
            raise DockerUnavailable(f"docker import failed: {r.text[-300:]}")
        return time.perf_counter() - t0

    def run_detached(self, cmd: list[str] | None = None) -> tuple[str, float]:
        api = self._api()
        t0 = time.perf_counter()
        r = api.post("/containers/create", json={
            "Image": IMAGE, "Cmd": cmd or ["tail", "-f", "/dev/null"],
            "HostConfig": {"NetworkMode": "none"}})
        r.raise_for_status()
        cid = str(r.json()["Id"])
        self.containers.add(cid)
        api.post(f"/containers/{cid}/start").raise_for_status()
        return cid, time.perf_counter() - t0

    def exec(self, cid: str, cmd: list[str]) -> tuple[float, bytes]:
        """``docker exec`` (create, start attached, inspect exit code): (seconds, raw output)."""
        api = self._api()
        t0 = time.perf_counter()
        r = api.post(f"/containers/{cid}/exec", json={
            "AttachStdout": True, "AttachStderr": True, "Cmd": cmd})
        r.raise_for_status()
        eid = r.json()["Id"]
        out = api.post(f"/exec/{eid}/start", json={"Detach": False, "Tty": False})
        out.raise_for_status()
        code = api.get(f"/exec/{eid}/json").json().get("ExitCode")
        elapsed = time.perf_counter() - t0
        if code != 0:
            raise RuntimeError(f"docker exec {cmd} exited {code}")
        return elapsed, out.content

    def remove(self, cid: str) -> float:
        t0 = time.perf_counter()
        self._api().delete(f"/containers/{cid}", params={"force": "true"}, timeout=60.0)
        self.containers.discard(cid)
        return time.perf_counter() - t0

    def container_pids(self, cid: str) -> list[int]:
        r = self._api().get(f"/containers/{cid}/json")
        pid = int(r.json().get("State", {}).get("Pid") or 0)
        return [pid] if pid else []

    def close(self) -> None:
        if self.client is not None:
            for cid in list(self.containers):
                with contextlib.suppress(httpx.HTTPError):
                    self.remove(cid)
            self.client.close()
        stop_dockerd(self.proc, self.workdir)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _tar_stream(rootfs: Path) -> Iterator[bytes]:
    """A tar of ``rootfs`` (one directory) streamed in chunks."""
    proc = subprocess.Popen(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", "-", "."],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    try:
        while chunk := proc.stdout.read(1 << 20):
            yield chunk
    finally:
        proc.stdout.close()
        proc.wait(timeout=60)
