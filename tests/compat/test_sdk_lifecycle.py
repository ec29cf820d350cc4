"""The released ``opensandbox`` SDK drives the whole lifecycle against ``sandlot serve``."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from opensandbox import Sandbox, SandboxManager
from opensandbox.exceptions import SandboxApiException, SandboxException
from opensandbox.models.sandboxes import SandboxFilter

from tests.compat.conftest import COMPAT_IMAGE, SandlotServer
from tests.compat.test_image_pull import create_expecting_pull_failure

pytestmark = [pytest.mark.backends("oci", "docker"), pytest.mark.heavy_backends("runsc")]


async def test_sdk_lifecycle(sandlot_server: SandlotServer) -> None:
    cfg = sandlot_server.sdk_config()
    sandbox = await Sandbox.create(
        COMPAT_IMAGE,
        connection_config=cfg,
        metadata={"suite": "compat", "case": "lifecycle"},
        resource={"cpu": "500m", "memory": "512Mi"},
        timeout=timedelta(minutes=10),
        ready_timeout=timedelta(seconds=60),
    )
    manager = await SandboxManager.create(connection_config=sandlot_server.sdk_config())
    try:
        assert await sandbox.is_healthy()
        info = await sandbox.get_info()
        assert info.status.state == "Running"
        assert info.metadata == {"suite": "compat", "case": "lifecycle"}
        assert info.image is not None and info.image.image == COMPAT_IMAGE
        assert info.expires_at is not None

        page = await manager.list_sandbox_infos(
            SandboxFilter(metadata={"case": "lifecycle"}, states=["Running"])
        )
        assert [i.id for i in page.sandbox_infos] == [sandbox.id]
        assert page.pagination.total_items == 1

        got = await manager.get_sandbox_info(sandbox.id)
        assert got.id == sandbox.id and got.status.state == "Running"

        before = datetime.now(UTC)
        renewed = await sandbox.renew(timedelta(minutes=30))
        assert renewed.expires_at >= before + timedelta(minutes=29)
        assert (await sandbox.get_info()).expires_at == renewed.expires_at

        await manager.pause_sandbox(sandbox.id)
        assert (await manager.get_sandbox_info(sandbox.id)).status.state == "Paused"
        with pytest.raises(SandboxException) as conflict:
            await manager.pause_sandbox(sandbox.id)
        assert isinstance(conflict.value, SandboxApiException)
        assert conflict.value.status_code == 409
        assert conflict.value.error.code == "DOCKER::SANDBOX_NOT_RUNNING"

        resumed = await Sandbox.resume(
            sandbox.id,
            connection_config=sandlot_server.sdk_config(),
            resume_timeout=timedelta(seconds=60),
        )
        try:
            assert await resumed.is_healthy()
            assert (await resumed.get_info()).status.state == "Running"
        finally:
            await resumed.close()

        await sandbox.kill()
        with pytest.raises(SandboxException):
            await manager.get_sandbox_info(sandbox.id)
        assert sandbox.id not in sandlot_server.runtime_ids()
    finally:
        await sandbox.close()
        await manager.close()


@pytest.mark.parametrize("proxy", [False, True], ids=["direct", "server-proxy"])
async def test_sdk_commands_and_files(sandlot_server: SandlotServer, proxy: bool) -> None:
    from opensandbox.models.filesystem import WriteEntry

    sandbox = await Sandbox.create(
        COMPAT_IMAGE,
        connection_config=sandlot_server.sdk_config(proxy=proxy),
        ready_timeout=timedelta(seconds=60),
    )
    try:
        endpoint = await sandbox.get_endpoint(44772)
        if proxy:
            assert f"/sandboxes/{sandbox.id}/proxy/44772" in endpoint.endpoint
        else:
            assert endpoint.endpoint.startswith("127.0.0.1:")
        execution = await sandbox.commands.run("python -c 'print(1 + 1)'")
        assert "".join(m.text for m in execution.logs.stdout).strip() == "2"
        await sandbox.files.write_files(
            [WriteEntry(path="/tmp/hello.txt", data="Hello World", mode=644)]
        )
        assert await sandbox.files.read_file("/tmp/hello.txt") == "Hello World"
    finally:
        await sandbox.destroy()


def test_an_unpullable_image_is_reported_as_a_pull_failure(
    sandlot_server: SandlotServer,
) -> None:
    with sandlot_server.client() as c:
        message = create_expecting_pull_failure(
            c,
            {
                "image": {"uri": "127.0.0.1:1/nothing/here:1"},
                "entrypoint": ["tail", "-f", "/dev/null"],
                "resourceLimits": {"cpu": "1", "memory": "1Gi"},
                "timeout": 600,
            },
        )
        assert message.startswith("Failed to pull image 127.0.0.1:1/nothing/here:1: ")
