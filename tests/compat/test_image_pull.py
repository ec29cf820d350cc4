"""A create whose image is not local pulls it from a registry (with the SDK's image auth)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import httpx
import pytest
from opensandbox import Sandbox
from opensandbox.config import ConnectionConfig
from opensandbox.models.sandboxes import SandboxImageAuth, SandboxImageSpec

from sandlot.images.store import ImageStore
from tests.compat.conftest import SandlotServer
from tests.conftest import LocalRegistry

pytestmark = pytest.mark.backends("oci", "docker")


def create_expecting_pull_failure(c: httpx.Client, body: dict) -> str:
    """Create a sandbox whose image cannot be pulled; returns the reported message.

    The reference answers the create itself with 500 ``DOCKER::SANDBOX_IMAGE_PULL_FAILED``;
    sandlot does when the pull fails within ``server.create_wait_seconds``, and otherwise
    answers Pending and then reports ``Failed`` / ``PROVISIONING_ERROR`` with the same message.
    """
    r = c.post("/v1/sandboxes", json=body)
    if r.status_code == 500:
        err = r.json()
        assert err["code"] == "DOCKER::SANDBOX_IMAGE_PULL_FAILED", err
        return str(err["message"])
    assert r.status_code == 202, r.text
    sid = r.json()["id"]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = c.get(f"/v1/sandboxes/{sid}").json()["status"]
        if status["state"] != "Pending":
            break
        time.sleep(0.2)
    assert status["state"] == "Failed" and status["reason"] == "PROVISIONING_ERROR", status
    assert c.delete(f"/v1/sandboxes/{sid}").status_code == 204
    return str(status["message"])


@pytest.fixture
def tiny_image(auth_registry: LocalRegistry, image_store: ImageStore) -> Iterator[str]:
    """A one-layer image with no shell at all: execd comes from its own bundle."""
    root = Path(tempfile.mkdtemp(prefix="sltiny-"))
    try:
        for sub in ("etc", "tmp", "proc", "sys", "dev", "run", "root"):
            (root / sub).mkdir()
        os.chmod(root / "tmp", 0o1777)
        ref = auth_registry.push_rootfs(root, "tiny:1")
        yield ref
    finally:
        shutil.rmtree(root, ignore_errors=True)
        if image_store.get(ref) is not None:
            image_store.remove(ref)


async def test_create_pulls_with_auth(
    sandlot_server: SandlotServer, auth_registry: LocalRegistry, tiny_image: str
) -> None:
    assert auth_registry.auth is not None
    cfg = ConnectionConfig(domain=sandlot_server.domain, api_key=sandlot_server.api_key)
    with sandlot_server.client() as c:
        # Without credentials the registry refuses: the create says why, in the reference's
        # terms (an error answer, or Failed/PROVISIONING_ERROR when it outlasted the wait).
        message = create_expecting_pull_failure(
            c, {"image": {"uri": tiny_image}, "entrypoint": ["/none"], "timeout": 600}
        )
        assert message.startswith(f"Failed to pull image {tiny_image}: ")

    image = SandboxImageSpec(
        image=tiny_image,
        auth=SandboxImageAuth(
            username=auth_registry.auth.username, password=auth_registry.auth.password
        ),
    )
    sandbox = await Sandbox.create(
        image,
        connection_config=cfg,
        entrypoint=["/no/such/program"],
        ready_timeout=timedelta(seconds=120),
    )
    try:
        assert await sandbox.is_healthy()
        info = await sandbox.get_info()
        assert info.status.state == "Running"
        assert info.image is not None and info.image.image == tiny_image
        assert info.image.auth is None  # credentials are never echoed
    finally:
        await sandbox.destroy()
