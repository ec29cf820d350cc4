"""The compat suite's core on the kubernetes backend: the released ``opensandbox`` SDK's
lifecycle, commands and files (direct and through the server proxy) and the quickstart."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from opensandbox import Sandbox, SandboxManager
from opensandbox.exceptions import SandboxApiException, SandboxException

from tests.compat.conftest import COMPAT_IMAGE, SandlotServer
from tests.compat.test_quickstart import test_quickstart_prints_hello_world as quickstart
from tests.compat.test_sdk_lifecycle import test_sdk_commands_and_files as commands_and_files

pytestmark = [pytest.mark.backends("kubernetes"), pytest.mark.timeout(600)]


async def test_sdk_lifecycle_on_pods(sandlot_server: SandlotServer) -> None:
    assert sandlot_server.k8s is not None
    sandbox = await Sandbox.create(
        COMPAT_IMAGE, connection_config=sandlot_server.sdk_config(),
        metadata={"suite": "k8s", "case": "lifecycle"},
        resource={"cpu": "500m", "memory": "512Mi"},
        timeout=timedelta(minutes=10), ready_timeout=timedelta(seconds=120),
    )
    manager = await SandboxManager.create(connection_config=sandlot_server.sdk_config())
    try:
        assert await sandbox.is_healthy()
        info = await sandbox.get_info()
        assert info.status.state == "Running"
        assert info.metadata == {"suite": "k8s", "case": "lifecycle"}

        pod = json.loads(sandlot_server.k8s.kubectl(
            "get", "pod", f"sandlot-{sandbox.id}", "-o", "json").stdout)
        assert pod["metadata"]["labels"]["sandlot.io/sandbox-id"] == sandbox.id
        assert json.loads(pod["metadata"]["annotations"]["sandlot.io/metadata"]) == \
            {"suite": "k8s", "case": "lifecycle"}
        main = pod["spec"]["containers"][0]
        assert main["resources"]["limits"] == {"cpu": "500m", "memory": str(512 << 20)}
        assert main["securityContext"]["allowPrivilegeEscalation"] is False
        assert main["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert "SYS_ADMIN" in main["securityContext"]["capabilities"]["drop"]
        assert pod["spec"]["automountServiceAccountToken"] is False
        assert [c["name"] for c in pod["spec"]["initContainers"]] == ["sandlot-execd-installer"]
        # the execd token is in a Secret of the Pod's, never in its spec
        assert "SANDLOT_EXECD_TOKEN" not in {e["name"]: e for e in main["env"] if "value" in e}
        run = await sandbox.commands.run("cat /proc/1/cmdline | tr '\\0' ' '; hostname")
        out = "".join(m.text for m in run.logs.stdout)
        assert "sandlot.execd" in out

        for call in (manager.pause_sandbox, manager.resume_sandbox):
            with pytest.raises(SandboxException) as unsupported:
                await call(sandbox.id)
            assert isinstance(unsupported.value, SandboxApiException)
            # the reference's answer for its Kubernetes workloads that cannot pause
            assert unsupported.value.status_code == 400
            assert "KUBERNETES::INVALID_STATE" in str(unsupported.value)
            assert "is not supported for this sandbox type" in str(unsupported.value)
        assert (await sandbox.get_info()).status.state == "Running"

        await sandbox.kill()
        with pytest.raises(SandboxException):
            await manager.get_sandbox_info(sandbox.id)
        assert sandbox.id not in sandlot_server.runtime_ids()
        # the delete is answered at once; the kubelet stops the Pod within its grace period
        sandlot_server.k8s.kubectl("wait", "--for=delete", f"pod/sandlot-{sandbox.id}",
                                   "--timeout=90s", check=False)
        assert sandlot_server.k8s.kubectl(
            "get", "pod", f"sandlot-{sandbox.id}", check=False).returncode != 0
        assert not sandlot_server.k8s.kubectl(
            "get", "secrets", "-l", f"sandlot.io/sandbox-id={sandbox.id}", "-o", "name"
        ).stdout.strip()
    finally:
        await sandbox.close()
        await manager.close()


@pytest.mark.parametrize("proxy", [False, True], ids=["direct", "server-proxy"])
async def test_commands_and_files(sandlot_server: SandlotServer, proxy: bool) -> None:
    await commands_and_files(sandlot_server, proxy)


@pytest.mark.parametrize("proxy", [False, True], ids=["direct", "server-proxy"])
def test_quickstart(sandlot_server: SandlotServer, proxy: bool) -> None:
    quickstart(sandlot_server, proxy)
