"""Images come from the engine: pulled with the request's credentials when missing, refused
with a clear error when the engine cannot get them. The registry is a local test registry."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandlot.errors import ImageNotFound, ImagePullError, InvalidRequest
from sandlot.images.model import RegistryAuth
from sandlot.runtime.base import ImageRef
from sandlot.runtime.docker import DockerRuntime
from tests.conftest import LocalRegistry
from tests.docker_engine import PrivateDockerd
from tests.runtime.docker.helpers import adexec, dspec, wait_ready


def _scratch_rootfs(root: Path) -> Path:
    """No shell, no Python, no libc: execd brings everything it needs in its bundle."""
    for sub in ("etc", "tmp", "proc", "sys", "dev", "run", "opt", "root"):
        (root / sub).mkdir(parents=True)
    os.chmod(root / "tmp", 0o1777)
    (root / "etc" / "marker").write_text("pulled\n")
    return root


async def test_pull_with_the_requests_credentials(
    docker_runtime: DockerRuntime, auth_registry: LocalRegistry, private_dockerd: PrivateDockerd,
    tmp_path: Path,
) -> None:
    rt = docker_runtime
    assert auth_registry.auth is not None
    ref = auth_registry.push_rootfs(_scratch_rootfs(tmp_path / "rootfs"), "sandlot/scratch")
    steps: list[tuple[str, str]] = []

    async def progress(reason: str, message: str) -> None:
        steps.append((reason, message))

    # without credentials the registry says no, and so does the create
    with pytest.raises((ImageNotFound, ImagePullError), match="sandlot/scratch"):
        await rt.create(dspec("dk-noauth", ref))
    assert "dk-noauth" not in await rt.list_ids()
    wrong = RegistryAuth(username=auth_registry.auth.username, password="wrong")
    spec = dspec("dk-badauth", ref)
    spec.image = ImageRef(ref, auth=wrong)
    with pytest.raises((ImageNotFound, ImagePullError)):
        await rt.create(spec)

    spec = dspec("dk-pulled", ref)
    spec.image = ImageRef(ref, auth=auth_registry.auth)
    await rt.create(spec, progress)
    assert steps and steps[0][0] == "Pulling" and ref in steps[0][1]
    await wait_ready(rt, "dk-pulled")  # execd runs in an image without libc or shell
    assert private_dockerd.client is not None
    assert private_dockerd.client.images.get(ref)
    # the second create finds it in the engine: no pull step
    steps.clear()
    await rt.create(dspec("dk-again", ref), progress)
    assert steps == []
    await wait_ready(rt, "dk-again")


async def test_missing_image_is_refused_clearly(
    docker_runtime: DockerRuntime, registry: LocalRegistry
) -> None:
    rt = docker_runtime
    ref = registry.ref("sandlot/nothing-here:1")
    with pytest.raises(ImageNotFound, match="nothing-here"):
        await rt.create(dspec("dk-missing", ref))
    assert await rt.list_ids() == set()


async def test_platform_the_image_is_not_built_for(
    docker_runtime: DockerRuntime, docker_base_image: str
) -> None:
    spec = dspec("dk-arm", docker_base_image)
    spec.image = ImageRef(docker_base_image, platform="linux/s390x")
    with pytest.raises(InvalidRequest, match="s390x"):
        await docker_runtime.create(spec)


async def test_image_working_dir_and_env_apply(
    docker_runtime: DockerRuntime, docker_base_image: str, private_dockerd: PrivateDockerd
) -> None:
    rt = docker_runtime
    await rt.create(dspec("dk-env", docker_base_image, env={"GREETING": "hi there"}))
    await wait_ready(rt, "dk-env")
    r = await adexec(private_dockerd, "dk-env",
                     # the container's environment (execd, PID 1, is not dumpable: its
                     # /proc/1/environ is closed to the workload)
                     "env | grep -E '^(LANG|GREETING)='")
    assert "LANG=C.UTF-8" in r.output and "GREETING=hi there" in r.output
