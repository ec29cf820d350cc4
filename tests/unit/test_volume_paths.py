"""Volume request checks, the no-symlink walk and the pvc store (no sandbox needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandlot.errors import InvalidRequest, Unsupported
from sandlot.runtime.base import VolumeSpec
from sandlot.runtime.hostpath import PathEscape, open_beneath
from sandlot.runtime.oci.volumes import PvcStore
from sandlot.server.volume_checks import check_volumes


def _host(path: str, **kw: object) -> dict[str, object]:
    return {"name": "v", "host": {"path": path}, "mountPath": "/mnt/v", **kw}


@pytest.fixture
def allowed(tmp_path: Path) -> Path:
    d = tmp_path / "allowed"
    (d / "inside").mkdir(parents=True)
    (d / "link-in").symlink_to(d / "inside")
    (d / "link-out").symlink_to(tmp_path)
    return d


def _code(volumes: list[dict[str, object]], allowed: list[str]) -> str:
    with pytest.raises((InvalidRequest, Unsupported)) as err:
        check_volumes(volumes, allowed)
    return err.value.code


def test_host_paths(allowed: Path, tmp_path: Path) -> None:
    ok = [str(allowed)]
    check_volumes([_host(str(allowed / "inside"))], ok)
    check_volumes([_host(str(allowed / "link-in"))], ok)  # a link that stays inside
    check_volumes([_host(str(allowed / "not-yet"))], ok)  # made when mounted
    assert _code([_host(str(allowed))], []) == "VOLUME::HOST_PATH_NOT_ALLOWED"
    assert _code([_host(str(tmp_path))], ok) == "VOLUME::HOST_PATH_NOT_ALLOWED"
    assert _code([_host(str(allowed) + "2")], ok) == "VOLUME::HOST_PATH_NOT_ALLOWED"
    assert _code([_host(str(allowed / "link-out"))], ok) == "VOLUME::HOST_PATH_NOT_ALLOWED"
    assert _code([_host(str(allowed / "inside"), subPath="../../x")], ok) == \
        "VOLUME::INVALID_SUB_PATH"
    assert _code([_host(f"{allowed}/../allowed")], ok) == "VOLUME::INVALID_HOST_PATH"
    assert _code([_host(f"{allowed}//inside")], ok) == "VOLUME::INVALID_HOST_PATH"
    assert _code([_host("relative")], ok) == "VOLUME::INVALID_HOST_PATH"


def test_request_shape() -> None:
    pvc = {"name": "p", "pvc": {"claimName": "c"}, "mountPath": "/p"}
    check_volumes([pvc], [])
    assert _code([pvc, pvc], []) == "VOLUME::DUPLICATE_NAME"
    assert _code([{**pvc, "name": "Up"}], []) == "VOLUME::INVALID_NAME"
    assert _code([{**pvc, "mountPath": "rel"}], []) == "VOLUME::INVALID_MOUNT_PATH"
    for reserved in ("/", "/proc", "/opt/sandlot/bin", "/etc/hosts"):
        assert _code([{**pvc, "mountPath": reserved}], []) == "VOLUME::INVALID_MOUNT_PATH"
    assert _code([{**pvc, "subPath": "/abs"}], []) == "VOLUME::INVALID_SUB_PATH"
    assert _code([{**pvc, "pvc": {"claimName": "Bad!"}}], []) == "VOLUME::INVALID_PVC_NAME"
    assert _code([{**pvc, "pvc": {"claimName": "c", "storage": "1Gi"}}], []) == \
        "VOLUME::UNSUPPORTED_BACKEND"
    # a runtime that enforces pvc sizes (oci) checks the size instead
    sized = {**pvc, "pvc": {"claimName": "c", "storage": "1Gi"}}
    check_volumes([sized], [], pvc_size=True)
    for bad in ("lots", "1Ki", "-1Gi"):
        with pytest.raises(InvalidRequest) as err:
            check_volumes([{**pvc, "pvc": {"claimName": "c", "storage": bad}}], [],
                          pvc_size=True)
        assert err.value.code == "VOLUME::INVALID_PVC_STORAGE" and repr(bad) in err.value.message
    with pytest.raises(Unsupported) as unsupported:
        check_volumes([sized], [], runtime_name="docker")
    assert "docker" in unsupported.value.message and "tmpfs" in unsupported.value.message
    assert _code([{"name": "o", "ossfs": {"bucket": "b"}, "mountPath": "/o"}], []) == \
        "VOLUME::UNSUPPORTED_BACKEND"
    assert _code([{"name": "n", "mountPath": "/n"}], []) == "VOLUME::INVALID_BACKEND"


def test_open_beneath_never_follows_links(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "up").symlink_to("/")
    (tmp_path / "a" / "in").symlink_to(tmp_path / "a" / "b")
    (tmp_path / "a" / "file").write_text("x")
    fd = open_beneath(str(tmp_path), "a/b")
    try:
        assert os.path.samestat(os.fstat(fd), os.stat(tmp_path / "a" / "b"))
    finally:
        os.close(fd)
    for rel in ("a/up", "a/up/etc", "a/in", "a/file"):
        with pytest.raises(PathEscape):
            open_beneath(str(tmp_path), rel, create=True)
    with pytest.raises(PathEscape):
        open_beneath(str(tmp_path), "a/../a")
    with pytest.raises(FileNotFoundError):
        open_beneath(str(tmp_path), "a/missing")
    os.close(open_beneath(str(tmp_path), "a/new/deeper", create=True))
    assert (tmp_path / "a" / "new" / "deeper").is_dir()
    assert not (Path("/etc") / "deeper").exists()


def test_pvc_store_lifecycle(tmp_path: Path) -> None:
    store = PvcStore(tmp_path / "volumes")
    store.acquire("gone", "s1", create=True, delete_when_unused=True, volume_name="v")
    store.acquire("gone", "s2", create=False, delete_when_unused=False, volume_name="v")
    store.acquire("kept", "s1", create=True, delete_when_unused=False, volume_name="v")
    assert oct((tmp_path / "volumes").stat().st_mode & 0o777) == "0o700"
    assert store.users("gone") == {"s1", "s2"}
    assert store.release("s1") == []  # s2 still uses it
    assert store.exists("gone") and store.exists("kept")
    assert store.release("s2") == ["gone"]
    assert not store.exists("gone") and store.exists("kept")
    # the flag of a later request does not make an existing claim removable
    store.acquire("kept", "s3", create=True, delete_when_unused=True, volume_name="v")
    assert store.release("s3") == [] and store.exists("kept")
    with pytest.raises(InvalidRequest) as err:
        store.acquire("none", "s4", create=False, delete_when_unused=False, volume_name="v")
    assert err.value.code == "VOLUME::PVC_NOT_FOUND"
    pvc = VolumeSpec(name="v", kind="pvc", source="kept", mount_path="/k", sub_path="x/y")
    (store.data_dir("kept") / "x").symlink_to("/")
    with pytest.raises(InvalidRequest) as err:
        store.check(pvc)
    assert err.value.code == "VOLUME::INVALID_SUB_PATH"


def test_nested_mount_paths_are_mounted_outer_first(tmp_path: Path) -> None:
    from sandlot.runtime.oci.volumes import StagedVolume, oci_mounts

    inner = VolumeSpec(name="i", kind="pvc", source="c", mount_path="/data/inner",
                       read_only=True)
    outer = VolumeSpec(name="o", kind="pvc", source="c", mount_path="/data")
    got = oci_mounts([StagedVolume(inner, tmp_path / "i"), StagedVolume(outer, tmp_path / "o")])
    assert [m["destination"] for m in got] == ["/data", "/data/inner"]
    assert got[1]["options"] == ["bind", "ro", "nosuid", "nodev"]
    assert got[0]["source"] == str(tmp_path / "o")


def test_the_data_dir_is_never_bound(tmp_path: Path) -> None:
    data = tmp_path / "data"
    (data / "sandboxes").mkdir(parents=True)
    allowed = [str(tmp_path)]
    for path in (data, data / "sandboxes", tmp_path):
        with pytest.raises(InvalidRequest) as err:
            check_volumes([_host(str(path))], allowed, data_dir=str(data))
        assert err.value.code == "VOLUME::HOST_PATH_NOT_ALLOWED"
        assert "data dir" in err.value.message
    check_volumes([_host(str(tmp_path / "other"))], allowed, data_dir=str(data))
