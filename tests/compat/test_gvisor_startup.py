"""gVisor configured: ``sandlot doctor`` reports the host, and ``sandlot serve`` refuses to
start (saying why) when runsc is missing, instead of falling back to runc."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.compat.conftest import needs_backend


def _path_without(binary: str, shadow: Path) -> str:
    """PATH with every directory that holds ``binary`` replaced by a copy without it (the
    copies are made under ``shadow``, a test's own temporary directory)."""
    parts = []
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if d and (Path(d) / binary).exists():
            copy = shadow / str(len(parts))
            copy.mkdir(parents=True)
            for f in Path(d).iterdir():
                if f.name != binary:
                    (copy / f.name).symlink_to(f)
            parts.append(str(copy))
        else:
            parts.append(d)
    return os.pathsep.join(parts)


@pytest.fixture
def gvisor_config(tmp_path: Path) -> Path:
    data = Path(tempfile.mkdtemp(prefix="slg-", dir="/tmp"))
    cfg = tmp_path / "sandlot.toml"
    cfg.write_text(f'data_dir = "{data}"\n[server]\napi_key = "k"\nport = 1\n'
                   '[secure_runtime]\ntype = "gvisor"\n')
    yield cfg
    shutil.rmtree(data, ignore_errors=True)


def test_serve_refuses_without_runsc(gvisor_config: Path, tmp_path: Path) -> None:
    needs_backend("runc")
    env = {**os.environ, "PATH": _path_without("runsc", tmp_path / "path")}
    assert shutil.which("runsc", path=env["PATH"]) is None
    p = subprocess.run([sys.executable, "-m", "sandlot", "serve", "--config", str(gvisor_config)],
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "gVisor runtime 'runsc' is not on PATH" in p.stderr
    assert "does not fall back to runc" in p.stderr
    assert "Uvicorn running" not in p.stderr


def test_doctor_reports_this_host(gvisor_config: Path) -> None:
    needs_backend("runsc")
    p = subprocess.run([sys.executable, "-m", "sandlot", "doctor", "--config", str(gvisor_config)],
                       capture_output=True, text=True, timeout=300,
                       env={**os.environ, "COLUMNS": "200"})
    assert p.returncode == 0, p.stdout
    for check in ("runc runs a container", "runsc runs a container", "cgroups", "overlayfs",
                  "user namespaces", "nftables", "network namespaces and veth", "data dir"):
        assert check in p.stdout
    assert "kernel inside: 4.4.0" in p.stdout  # runsc really ran a container
    assert "FAIL" not in p.stdout


def test_doctor_fails_when_gvisor_configured_without_runsc(gvisor_config: Path,
                                                            tmp_path: Path) -> None:
    needs_backend("runc")
    env = {**os.environ, "PATH": _path_without("runsc", tmp_path / "path"), "COLUMNS": "200"}
    p = subprocess.run([sys.executable, "-m", "sandlot", "doctor", "--config", str(gvisor_config)],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stdout
    assert "FAIL" in p.stdout and "apt-get install runsc" in p.stdout
