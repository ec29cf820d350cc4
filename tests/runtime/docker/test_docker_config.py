"""``[docker]``: the reference server's keys, their checks at start, and upstream's own
``init-config --example docker`` file loading unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel, Field

from sandlot.config import DEFAULT_DROPPED_CAPABILITIES, Config, DockerConfig
from sandlot.errors import RuntimeFailure
from sandlot.runtime.docker import DockerRuntime
from sandlot.runtime.docker.container import security_options
from sandlot.runtime.oci.seccomp import seccomp_profile
from sandlot.runtime.registry import runtime_class
from tests.docker_engine import PrivateDockerd
from tests.runtime.docker.conftest import closing, open_docker_runtime
from tests.runtime.docker.helpers import adexec, dspec, wait_ready

# What `opensandbox-server init-config --example docker` writes: the reference server copies
# its packaged examples/example.config.toml verbatim; this is that file, unchanged.
UPSTREAM_EXAMPLE = Path(__file__).parent / "fixtures" / "upstream-example-docker.toml"
SANDLOT_SECCOMP = f"seccomp={json.dumps(seccomp_profile())}"


def test_upstream_example_loads_unchanged() -> None:
    cfg = Config.load(UPSTREAM_EXAMPLE)
    assert cfg.refusals() == []
    assert cfg.runtime.type == "docker"
    assert runtime_class(cfg.runtime.type) is DockerRuntime
    d = cfg.docker
    assert d.network_mode == "bridge"
    assert d.no_new_privileges is True and d.pids_limit == 4096
    assert d.drop_capabilities == DEFAULT_DROPPED_CAPABILITIES
    # "" = sandlot's own seccomp profile (the oci runtime's), not the engine's default
    assert security_options(d) == ["no-new-privileges=true", SANDLOT_SECCOMP]
    # keys sandlot does not use are named, never silently dropped
    assert any("execd_image" in w for w in cfg.warnings())


def test_docker_defaults_match_the_reference() -> None:
    d = DockerConfig()
    assert d.network_mode == "host" and d.pids_limit == 4096 and d.no_new_privileges
    assert (d.port_range_min, d.port_range_max) == (40000, 60000)


def test_host_ip_is_the_endpoint_host() -> None:
    cfg = Config.model_validate({"runtime": {"type": "docker"},
                                 "docker": {"host_ip": "sandbox-host.example"}})
    assert cfg.server.endpoint_host == "sandbox-host.example"
    cfg = Config.model_validate({"runtime": {"type": "docker"},
                                 "server": {"endpoint_host": "own.example"},
                                 "docker": {"host_ip": "sandbox-host.example"}})
    assert cfg.server.endpoint_host == "own.example"


def test_security_options(tmp_path: Path) -> None:
    assert security_options(DockerConfig(no_new_privileges=False)) == [SANDLOT_SECCOMP]
    assert security_options(DockerConfig(apparmor_profile="docker-default")) == [
        "no-new-privileges=true", "apparmor=docker-default", SANDLOT_SECCOMP]
    assert security_options(DockerConfig(seccomp_profile="  ")) == [
        "no-new-privileges=true", SANDLOT_SECCOMP]
    assert security_options(DockerConfig(seccomp_profile="unconfined"))[-1] == \
        "seccomp=unconfined"
    profile = tmp_path / "p.json"
    profile.write_text('{"defaultAction": "SCMP_ACT_ALLOW"}')
    assert security_options(DockerConfig(seccomp_profile=str(profile)))[-1] == \
        'seccomp={"defaultAction": "SCMP_ACT_ALLOW"}'
    with pytest.raises(RuntimeFailure, match="absolute path"):
        security_options(DockerConfig(seccomp_profile="p.json"))
    with pytest.raises(RuntimeFailure, match="No such file"):
        security_options(DockerConfig(seccomp_profile=str(tmp_path / "missing.json")))
    profile.write_text("{not json")
    with pytest.raises(RuntimeFailure, match="p.json"):
        security_options(DockerConfig(seccomp_profile=str(profile)))


async def test_custom_seccomp_profile_and_no_pids_limit(
    docker_host: str, docker_data_dir: Path, docker_base_image: str,
    private_dockerd: PrivateDockerd, tmp_path: Path,
) -> None:
    profile = tmp_path / "deny-chroot.json"
    profile.write_text(json.dumps({
        "defaultAction": "SCMP_ACT_ALLOW",
        "syscalls": [{"names": ["chroot"], "action": "SCMP_ACT_ERRNO", "errnoRet": 1}],
    }))
    rt = await open_docker_runtime(docker_data_dir, seccomp_profile=str(profile),
                                   pids_limit=None, drop_capabilities=[])
    try:
        await rt.create(dspec("dk-sec", docker_base_image))
        await wait_ready(rt, "dk-sec")
        r = await adexec(private_dockerd, "dk-sec", "chroot / true 2>&1; echo rc=$?")
        assert "Operation not permitted" in r.output and "rc=125" in r.output
        assert private_dockerd.client is not None
        host = private_dockerd.client.api.inspect_container("sandlot-dk-sec")["HostConfig"]
        assert not host.get("PidsLimit")  # [docker] pids_limit = null: no limit
        assert not host.get("CapDrop")
        # the operator's profile wins: it alone is passed, not sandlot's own
        assert [o for o in host["SecurityOpt"] if o.startswith("seccomp=")] == [
            f"seccomp={profile.read_text()}"]
    finally:
        await closing(rt, private_dockerd)


async def test_unreachable_engine_is_refused(
    docker_data_dir: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/nothing.sock")
    with pytest.raises(RuntimeFailure, match="Docker engine is not reachable"):
        await open_docker_runtime(docker_data_dir)


class _SecureRuntime(BaseModel):
    type: str = ""
    docker_runtime: str | None = None


class _SecureConfig(Config):
    """Config with upstream's ``[secure_runtime]`` (its model comes with the gVisor work)."""

    secure_runtime: _SecureRuntime = Field(default_factory=_SecureRuntime)


async def test_secure_runtime_the_engine_lacks_is_refused(
    docker_host: str, docker_data_dir: Path, docker_base_image: str,
    private_dockerd: PrivateDockerd,
) -> None:
    base = {"data_dir": str(docker_data_dir), "docker": {"network_mode": "none"}}
    with pytest.raises(RuntimeFailure, match="no such runtime.*runc"):
        await DockerRuntime.open(_SecureConfig.model_validate(
            {**base, "secure_runtime": {"type": "gvisor", "docker_runtime": "no-such"}}))
    with pytest.raises(RuntimeFailure, match="needs docker_runtime"):
        await DockerRuntime.open(_SecureConfig.model_validate(
            {**base, "secure_runtime": {"type": "gvisor"}}))
    rt = await DockerRuntime.open(_SecureConfig.model_validate(
        {**base, "secure_runtime": {"type": "gvisor", "docker_runtime": "runc"}}))
    try:
        assert rt.plan.engine_runtime == "runc" and rt.capabilities.isolation == "docker/runc"
        await rt.create(dspec("dk-engine-rt", docker_base_image))
        await wait_ready(rt, "dk-engine-rt")
        assert private_dockerd.client is not None
        attrs = private_dockerd.client.api.inspect_container("sandlot-dk-engine-rt")
        assert attrs["HostConfig"]["Runtime"] == "runc"  # asked for by name, not defaulted
    finally:
        await closing(rt, private_dockerd)
