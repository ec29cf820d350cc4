"""Raw ``runc run -d`` / ``runc exec`` on the same rootfs: the floor for the OCI backend.

A minimal bundle made here (``runc spec`` defaults: own PID/mount/IPC/UTS/network namespaces,
read-only rootfs, no overlay, no execd): what starting a container costs before sandlot adds
anything.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

IDLE_ARGS = ["tail", "-f", "/dev/null"]  # the SDK's default entrypoint


class RuncBaseline:
    def __init__(self, rootfs: Path, workdir: Path, binary: str = "runc", prefix: str = "bench",
                 cgroup_parent: str | None = None):
        self.rootfs = rootfs
        # None: runc's default cgroup (its own, beside the host's other tasks); a name, e.g.
        # sandlot's ``sandlot``: each container in ``/<name>/<id>``, where sandlot puts its
        # sandboxes, so under load it gets the share of CPU a sandbox gets.
        self.cgroup_parent = cgroup_parent
        self.workdir = workdir
        self.binary = shutil.which(binary) or binary
        self.prefix = prefix
        self.state = workdir / "runc-state"
        self.bundle = workdir / "bundle"
        self.running: set[str] = set()
        self._ids = itertools.count(1)  # thread-safe enough: next() holds the GIL

    @staticmethod
    def available(binary: str = "runc") -> bool:
        return shutil.which(binary) is not None

    def prepare(self) -> None:
        self.bundle.mkdir(parents=True, exist_ok=True)
        self.state.mkdir(parents=True, exist_ok=True)
        subprocess.run([self.binary, "spec"], cwd=self.bundle, check=True, capture_output=True)
        spec_path = self.bundle / "config.json"
        spec = json.loads(spec_path.read_text())
        spec["process"]["terminal"] = False
        spec["process"]["args"] = IDLE_ARGS
        spec["root"] = {"path": str(self.rootfs), "readonly": True}
        spec["hostname"] = "runc-baseline"
        spec_path.write_text(json.dumps(spec, indent=1))

    def _bundle_for(self, cid: str) -> Path:
        """The bundle to start ``cid`` from: the shared one, or a copy naming its cgroup."""
        if self.cgroup_parent is None:
            return self.bundle
        spec = json.loads((self.bundle / "config.json").read_text())
        spec.setdefault("linux", {})["cgroupsPath"] = f"/{self.cgroup_parent}/{cid}"
        bundle = self.workdir / f"bundle-{cid}"
        bundle.mkdir(parents=True, exist_ok=True)
        (bundle / "config.json").write_text(json.dumps(spec, indent=1))
        return bundle

    def _runc(self, *args: str) -> list[str]:
        return [self.binary, "--root", str(self.state), *args]

    def run_detached(self) -> tuple[str, float]:
        """``runc run -d``: (container id, seconds)."""
        cid = f"{self.prefix}-{next(self._ids)}"
        bundle = self._bundle_for(cid)
        t0 = time.perf_counter()
        # The container inherits runc's stdio: a pipe would never reach EOF, so use a file.
        with tempfile.TemporaryFile() as err:
            proc = subprocess.run(self._runc("run", "-d", "--bundle", str(bundle), cid),
                                  stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=err, check=False, timeout=60)
            elapsed = time.perf_counter() - t0
            if proc.returncode != 0:
                err.seek(0)
                raise RuntimeError(f"runc run failed: {err.read().decode(errors='replace')[-300:]}")
        self.running.add(cid)
        return cid, elapsed

    def exec_argv(self, cid: str) -> list[str]:
        return self._runc("exec", cid)

    def exec(self, cid: str, *args: str) -> float:
        t0 = time.perf_counter()
        subprocess.run(self._runc("exec", cid, *args), stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, check=True, timeout=60)
        return time.perf_counter() - t0

    def delete(self, cid: str) -> float:
        t0 = time.perf_counter()
        subprocess.run(self._runc("delete", "-f", cid), capture_output=True, timeout=60,
                       check=False)
        self.running.discard(cid)
        elapsed = time.perf_counter() - t0
        if self.cgroup_parent is not None:
            shutil.rmtree(self.workdir / f"bundle-{cid}", ignore_errors=True)
        return elapsed

    def init_pid(self, cid: str) -> int | None:
        proc = subprocess.run(self._runc("state", cid), capture_output=True, text=True,
                              timeout=30, check=False)
        if proc.returncode != 0:
            return None
        return int(json.loads(proc.stdout).get("pid") or 0) or None

    def close(self) -> None:
        for cid in list(self.running):
            self.delete(cid)
        # Anything left from an interrupted run in our private state dir.
        if self.state.exists():
            listing = subprocess.run(self._runc("list", "-q"), capture_output=True, text=True,
                                     timeout=30, check=False)
            for cid in listing.stdout.split():
                self.delete(cid)
