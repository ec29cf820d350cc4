"""cgroup mount points are read from mountinfo once, and only kept once some were found."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandlot.runtime.oci import cgroups


def test_read_once_then_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[int] = []

    def read() -> tuple[Path, ...]:
        reads.append(1)
        return (Path("/sys/fs/cgroup/pids"),)

    monkeypatch.setattr(cgroups, "_mounts", ())
    monkeypatch.setattr(cgroups, "_read_cgroup_mounts", read)
    assert cgroups.cgroup_mounts() == (Path("/sys/fs/cgroup/pids"),)
    assert cgroups.cgroup_mounts() == (Path("/sys/fs/cgroup/pids"),)
    assert len(reads) == 1


def test_none_found_is_asked_again(monkeypatch: pytest.MonkeyPatch) -> None:
    answers = [(), (Path("/sys/fs/cgroup"),)]
    monkeypatch.setattr(cgroups, "_mounts", ())
    monkeypatch.setattr(cgroups, "_read_cgroup_mounts", lambda: answers.pop(0))
    assert cgroups.cgroup_mounts() == ()
    assert cgroups.cgroup_mounts() == (Path("/sys/fs/cgroup"),)


def test_this_host_has_cgroups() -> None:
    found = cgroups._read_cgroup_mounts()
    assert found and all(p.is_absolute() for p in found)
