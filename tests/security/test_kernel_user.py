"""Code kernels run as the image's ``User``, as commands and the entrypoint do (issue 11:
the image config's ``User`` is honoured; before, kernels ran as root whatever it said).

The store's code-interpreter image with ``User = nobody:nogroup`` set in its config, on a
real runc sandbox, driven through execd's ``/code`` API.
"""

from __future__ import annotations

import dataclasses
import json

from sandlot.images.model import ImageConfig
from sandlot.images.store import ImageStore
from sandlot.runtime.oci import OciRuntime
from tests.runtime.helpers import execd_client, spec, wait_ping

TOKEN = "ku"
IDS = "import os; print(os.getuid(), os.getgid(), os.getgroups())"


def _stdout(body: str) -> str:
    out = []
    for line in body.splitlines():
        line = line.removeprefix("data:").strip()
        if line.startswith("{"):
            event = json.loads(line)
            if event.get("type") == "stdout":
                out.append(event.get("text", ""))
            assert event.get("type") != "error", event
    return " ".join(out)


async def test_code_kernels_run_as_the_image_user(
    oci_runtime: OciRuntime, image_store: ImageStore
) -> None:
    rt = oci_runtime
    image = await image_store.build("code-interpreter", if_missing=True)
    image = dataclasses.replace(image, config=dataclasses.replace(
        image.config or ImageConfig(), user="nobody:nogroup"))
    await rt.create(spec("kuser", image, execd_token=TOKEN, memory_bytes=1 << 30))
    await wait_ping(rt, "kuser")
    headers = {"X-EXECD-ACCESS-TOKEN": TOKEN}
    async with execd_client(rt, "kuser", timeout=120, headers=headers) as c:
        r = await c.post("/command", json={"command": "id -u; id -g"})
        assert r.status_code == 200, r.text
        assert _stdout(r.text).split() == ["65534", "65534"]  # commands: the image's user

        r = await c.post("/code/context", json={"language": "python"})
        assert r.status_code == 200, r.text
        ctx = r.json()
        r = await c.post("/code", json={"code": IDS, "context": ctx})
        assert r.status_code == 200, r.text
        assert _stdout(r.text).split() == ["65534", "65534", "[]"]
        # The default context (a pre-started kernel) too.
        r = await c.post("/code", json={"code": IDS, "context": {"language": "python"}})
        assert r.status_code == 200, r.text
        assert _stdout(r.text).split() == ["65534", "65534", "[]"]
