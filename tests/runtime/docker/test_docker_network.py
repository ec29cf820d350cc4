"""``[docker] network_mode``: bridge (the fixture's default), none, host and a user-defined
network, each reached through ``connect`` only; bad modes refused at start."""

from __future__ import annotations

import asyncio
import secrets
from pathlib import Path

import pytest

from sandlot.errors import RuntimeFailure
from sandlot.runtime.docker.container import LABEL_EXECD_PORT, container_name
from tests.docker_engine import PrivateDockerd
from tests.runtime.docker.conftest import closing, open_docker_runtime
from tests.runtime.docker.helpers import adexec, dspec, wait_ready

# A one-line HTTP server the workload starts on a port of its own.
SERVE = ["python3", "-m", "http.server", "--bind", "{bind}", "{port}"]


def _serve(port: int, bind: str = "127.0.0.1") -> list[str]:
    return [a.format(bind=bind, port=port) for a in SERVE]


async def _http_get(rt, sandbox_id: str, port: int) -> bytes:  # type: ignore[no-untyped-def]
    """GET / on ``port`` inside the sandbox through connect (retried while it starts)."""
    for _ in range(200):
        try:
            sock = await rt.connect(sandbox_id, port)
        except ConnectionRefusedError:
            await asyncio.sleep(0.1)
            continue
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(b"GET / HTTP/1.0\r\nHost: x\r\n\r\n")
        data = await reader.read()
        writer.close()
        return data
    raise AssertionError(f"nothing listens on {port} in {sandbox_id}")


async def _interfaces(engine: PrivateDockerd, sandbox_id: str) -> set[str]:
    r = await adexec(engine, sandbox_id, "ls /sys/class/net")
    return set(r.output.split())


async def test_bridge_reaches_loopback_servers_and_has_an_address(
    docker_runtime, docker_base_image: str, private_dockerd: PrivateDockerd,  # type: ignore[no-untyped-def]
) -> None:
    rt = docker_runtime
    await rt.create(dspec("dk-br", docker_base_image, entrypoint=_serve(8000)))
    await wait_ready(rt, "dk-br")
    assert (await _http_get(rt, "dk-br", 8000)).startswith(b"HTTP/1.0 200")
    assert "eth0" in await _interfaces(private_dockerd, "dk-br")
    # execd listens on the sandbox's loopback only: not on its bridge address
    r = await adexec(private_dockerd, "dk-br", "cat /proc/net/tcp")
    execd_hex = f":{rt.plan.execd_port:04X}"
    listeners = [ln.split()[1] for ln in r.output.splitlines()[1:] if ln.split()[3] == "0A"]
    assert f"0100007F{execd_hex}" in listeners
    assert not any(a.endswith(execd_hex) and a != f"0100007F{execd_hex}" for a in listeners)
    # no automatic local port is ever execd's (a poll cannot self-connect onto it)
    r = await adexec(private_dockerd, "dk-br", "cat /proc/sys/net/ipv4/ip_local_reserved_ports")
    assert r.output.strip() == str(rt.plan.execd_port)


async def test_none_has_loopback_only_and_is_reached_through_its_namespace(
    docker_host: str, docker_data_dir: Path, docker_base_image: str,
    private_dockerd: PrivateDockerd,
) -> None:
    rt = await open_docker_runtime(docker_data_dir, network_mode="none")
    try:
        await rt.create(dspec("dk-none", docker_base_image, entrypoint=_serve(8001)))
        await wait_ready(rt, "dk-none")
        assert await _interfaces(private_dockerd, "dk-none") == {"lo"}
        assert (await _http_get(rt, "dk-none", 8001)).startswith(b"HTTP/1.0 200")
        with pytest.raises(ConnectionRefusedError):
            await rt.connect("dk-none", 8002)
    finally:
        await closing(rt, private_dockerd)


async def test_host_network_gives_each_execd_its_own_port_in_range(
    docker_host: str, docker_data_dir: Path, docker_base_image: str,
    private_dockerd: PrivateDockerd,
) -> None:
    rt = await open_docker_runtime(docker_data_dir, network_mode="host",
                                   port_range_min=47000, port_range_max=47999)
    try:
        for sid in ("dk-host1", "dk-host2"):
            await rt.create(dspec(sid, docker_base_image))
        for sid in ("dk-host1", "dk-host2"):
            await wait_ready(rt, sid)
        assert private_dockerd.client is not None
        ports = set()
        for sid in ("dk-host1", "dk-host2"):
            attrs = private_dockerd.client.api.inspect_container(container_name(sid))
            assert attrs["HostConfig"]["NetworkMode"] == "host"
            ports.add(int(attrs["Config"]["Labels"][LABEL_EXECD_PORT]))
        assert len(ports) == 2 and all(47000 <= p <= 47999 for p in ports)
        # the host's own interfaces are the sandbox's
        assert "eth0" in await _interfaces(private_dockerd, "dk-host1")
        await rt.delete("dk-host1")
        assert ports - rt.ports.taken  # its port is free again
    finally:
        await closing(rt, private_dockerd)


async def test_user_defined_network(
    docker_host: str, docker_data_dir: Path, docker_base_image: str,
    private_dockerd: PrivateDockerd,
) -> None:
    name = "sl-test-" + secrets.token_hex(3)
    with pytest.raises(RuntimeFailure, match="no such network"):
        await open_docker_runtime(docker_data_dir, network_mode=name)
    private_dockerd.create_network(name)
    assert private_dockerd.client is not None
    try:
        rt = await open_docker_runtime(docker_data_dir, network_mode=name)
        try:
            await rt.create(dspec("dk-user", docker_base_image, entrypoint=_serve(8003)))
            await wait_ready(rt, "dk-user")
            attrs = private_dockerd.client.api.inspect_container(container_name("dk-user"))
            assert list(attrs["NetworkSettings"]["Networks"]) == [name]
            assert (await _http_get(rt, "dk-user", 8003)).startswith(b"HTTP/1.0 200")
        finally:
            await closing(rt, private_dockerd)
    finally:
        private_dockerd.client.networks.get(name).remove()


@pytest.mark.parametrize("mode, message", [
    ("container:abc", "not supported"),
    (" ", "empty"),
])
async def test_bad_network_modes_are_refused(
    docker_host: str, docker_data_dir: Path, mode: str, message: str
) -> None:
    with pytest.raises(RuntimeFailure, match=message):
        await open_docker_runtime(docker_data_dir, network_mode=mode)


async def test_bad_port_range_is_refused(docker_host: str, docker_data_dir: Path) -> None:
    with pytest.raises(RuntimeFailure, match="port_range_min"):
        await open_docker_runtime(docker_data_dir, network_mode="host",
                                  port_range_min=50000, port_range_max=40000)
