"""The runtime boundary's contract, the same for every backend (``BACKENDS``).

What the server relies on: ``connect`` is the way into a sandbox (execd's port included) and
says ``NotFound``/``InvalidRequest``/``OSError`` clearly; ``create`` resolves the image itself
and returns a ``CreateResult``; ``delete`` is idempotent; ``inspect`` reports a missing
sandbox as ``MISSING``; ``capabilities`` is filled in. A new backend adds a factory here.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from sandlot.config import Config
from sandlot.errors import InvalidRequest, NotFound, SandlotError
from sandlot.images.model import Image
from sandlot.runtime import execd_client
from sandlot.runtime.base import (
    ContainerState,
    CreateResult,
    ImageRef,
    Runtime,
    RuntimeCapabilities,
    SandboxSpec,
)
from sandlot.runtime.oci import OciRuntime
from sandlot.runtime.registry import runtime_class
from tests.runtime.helpers import TEST_IMAGES, open_runtime


async def _oci(
    request: pytest.FixtureRequest, data_dir: Path, image: Image
) -> tuple[Runtime, ImageRef]:
    return await open_runtime(data_dir), TEST_IMAGES.add(image)


async def _docker(
    request: pytest.FixtureRequest, data_dir: Path, image: Image
) -> tuple[Runtime, ImageRef]:
    """The docker backend on the session's private dockerd (``base`` imported into it)."""
    from tests.runtime.docker.conftest import open_docker_runtime

    engine = request.getfixturevalue("private_dockerd")
    tag = request.getfixturevalue("docker_base_image")
    request.getfixturevalue("monkeypatch").setenv("DOCKER_HOST", engine.host)
    return await open_docker_runtime(data_dir, network_mode="none"), ImageRef(tag)


async def _oci_gvisor(
    request: pytest.FixtureRequest, data_dir: Path, image: Image
) -> tuple[Runtime, ImageRef]:
    """The oci runtime with ``[secure_runtime] type = "gvisor"`` (runsc), in a data dir of
    its own (runc and runsc state must not mix) sharing the session's execd bundle."""
    if shutil.which("runsc") is None:
        pytest.skip("runsc is not installed")
    gv = data_dir.with_name(data_dir.name + "-gv")
    gv.mkdir(exist_ok=True)
    bundle = gv / "execd-bundle"
    if not bundle.exists():
        (data_dir / "execd-bundle").mkdir(parents=True, exist_ok=True)
        bundle.symlink_to(data_dir / "execd-bundle")
    cfg = Config.model_validate({"data_dir": str(gv), "secure_runtime": {"type": "gvisor"}})
    return await OciRuntime.open(cfg, images=TEST_IMAGES), TEST_IMAGES.add(image)


Factory = Callable[[pytest.FixtureRequest, Path, Image], Awaitable[tuple[Runtime, ImageRef]]]
BACKENDS: dict[str, Factory] = {
    "oci": _oci,
    "docker": _docker,
    "oci-gvisor": _oci_gvisor,
}


@pytest.fixture(params=sorted(BACKENDS))
async def backend(
    request: pytest.FixtureRequest, runtime_data_dir: Path, rt_image: Image
) -> AsyncIterator[tuple[Runtime, ImageRef]]:
    rt, ref = await BACKENDS[request.param](request, runtime_data_dir, rt_image)
    try:
        yield rt, ref
    finally:
        for sid in await rt.list_ids():
            await rt.delete(sid)
        await rt.close()


async def test_registered_and_described(backend: tuple[Runtime, ImageRef]) -> None:
    rt, _ = backend
    assert runtime_class(rt.name) is type(rt)
    assert isinstance(rt.capabilities, RuntimeCapabilities) and rt.capabilities.isolation


async def test_connect_is_the_way_in(backend: tuple[Runtime, ImageRef]) -> None:
    rt, ref = backend
    token = "contract-token"
    result = await rt.create(SandboxSpec(sandbox_id="contract1", image=ref, entrypoint=[],
                                         execd_token=token))
    assert isinstance(result, CreateResult)

    async def connect():  # type: ignore[no-untyped-def]
        return await rt.connect("contract1", execd_client.DEFAULT_PORT)

    if not result.execd_ready:
        await execd_client.wait_ready(connect, token, timeout=60)
    assert await execd_client.ping(connect, token) == 200
    status, _ = await execd_client.request(connect, "GET", "/files/info?path=/", token="wrong")
    assert status == 401  # execd's own token check, reached through connect()
    sock = await connect()
    assert sock.getblocking() is False
    sock.close()
    with pytest.raises(OSError):
        (await rt.connect("contract1", 1)).close()  # nothing listens there
    with pytest.raises(InvalidRequest):
        await rt.connect("contract1", 70000)
    with pytest.raises(NotFound):
        await rt.connect("no-such-sandbox", execd_client.DEFAULT_PORT)
    assert (await rt.inspect("contract1")).state == ContainerState.RUNNING
    assert "contract1" in await rt.list_ids()
    await rt.delete("contract1")
    await rt.delete("contract1")  # idempotent
    assert (await rt.inspect("contract1")).state == ContainerState.MISSING
    with pytest.raises(NotFound):
        await rt.connect("contract1", execd_client.DEFAULT_PORT)


async def test_unknown_image_is_refused_and_leaves_nothing(
    backend: tuple[Runtime, ImageRef],
) -> None:
    rt, _ = backend
    with pytest.raises(SandlotError) as err:
        await rt.create(SandboxSpec(sandbox_id="contract2", image=ImageRef("no-such-image:1"),
                                    entrypoint=[]))
    assert "no-such-image" in str(err.value)
    assert "contract2" not in await rt.list_ids()
