"""``*_VERSION`` selection against a fake image root holding several versions of each language."""

from __future__ import annotations

import os
from pathlib import Path

from sandlot.execd.code import versions


def _exe(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)


def _image(root: Path) -> None:
    for v in ("11", "17", "21"):
        _exe(root / f"usr/lib/jvm/java-{v}-openjdk-amd64/bin/java")
    (root / "usr/lib/jvm/java-1.17.0-openjdk-amd64").symlink_to("java-17-openjdk-amd64")
    for v in ("1.19", "1.22"):
        _exe(root / f"usr/lib/go-{v}/bin/go")
    _exe(root / "opt/go/1.23.4/bin/go")
    for v in ("3.11", "3.12"):
        _exe(root / f"usr/bin/python{v}")
    _exe(root / "opt/node/v20.11.1/bin/node")
    _exe(root / "opt/node/v22.3.0/bin/node")


def test_installed_versions_are_found_in_debian_and_reference_places(tmp_path: Path):
    _image(tmp_path)
    assert [i.version for i in versions.installed("java", str(tmp_path))] == ["11", "17", "21"]
    assert [i.version for i in versions.installed("go", str(tmp_path))] == [
        "1.19", "1.22", "1.23.4"]
    assert [i.version for i in versions.installed("python", str(tmp_path))] == ["3.11", "3.12"]
    assert [i.version for i in versions.installed("node", str(tmp_path))] == [
        "20.11.1", "22.3.0"]


def test_pick_matches_like_the_reference(tmp_path: Path):
    _image(tmp_path)
    assert versions.pick("java", "17", str(tmp_path)).version == "17"  # type: ignore[union-attr]
    assert versions.pick("java", "1", str(tmp_path)) is None  # Java: the exact major only
    assert versions.pick("go", "1.2", str(tmp_path)).version == "1.23.4"  # type: ignore[union-attr]
    assert versions.pick("node", "v20", str(tmp_path)).version == "20.11.1"  # type: ignore[union-attr]
    assert versions.pick("python", "3.12", str(tmp_path)) is not None


def test_apply_switches_path_and_homes_and_keeps_the_default_when_unknown(tmp_path: Path):
    _image(tmp_path)
    env = {"PATH": "/usr/bin:/bin", "JAVA_VERSION": "11", "GO_VERSION": "1.22",
           "NODE_VERSION": "99"}
    outcome = versions.apply(env, str(tmp_path))
    java_home = str(tmp_path / "usr/lib/jvm/java-11-openjdk-amd64")
    assert env["JAVA_HOME"] == java_home
    assert env["GOROOT"] == str(tmp_path / "usr/lib/go-1.22")
    assert env["PATH"].split(os.pathsep)[:2] == [str(tmp_path / "usr/lib/go-1.22/bin"),
                                                 java_home + "/bin"]
    assert "not found" in outcome["node"] and "20.11.1, 22.3.0" in outcome["node"]
    assert str(tmp_path / "opt/node") not in env["PATH"]  # unknown: the default stays
