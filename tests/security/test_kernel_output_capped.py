"""A code kernel's own stdout and stderr cannot grow the host-side container log.

ipykernel hands out the descriptors it started with as ``sys.stdout.fileno()`` (and copies
every byte written to descriptors 1 and 2, a subprocess's output too, to them). Those were
execd's, i.e. the container log on the host: a cell could fill the host's disk. They are now
a pipe into a capped, rotated log in the sandbox's own ``/run/sandlot`` (kernels.log).

The store's code-interpreter image on a real runc sandbox, driven through execd's ``/code``.
"""

from __future__ import annotations

import json

from sandlot.images.store import ImageStore
from sandlot.runtime.oci import OciRuntime
from tests.runtime.helpers import execd_client, runc_exec, spec, wait_ping

TOKEN = "kout"
MIB = 1 << 20
# 40 MiB straight into the kernel's original stdout, then a marker line.
FLOOD = ("import os, sys\n"
         "fd = sys.stdout.fileno()\n"
         "chunk = b'k' * (1 << 20)\n"
         "for _ in range(40):\n"
         "    os.write(fd, chunk)\n"
         "os.write(fd, b'\\nflood-done\\n')\n"
         "print('wrote')\n")


def _events(body: str) -> list[dict[str, object]]:
    events = []
    for line in body.splitlines():
        line = line.removeprefix("data:").strip()
        if line.startswith("{"):
            events.append(json.loads(line))
    return events


async def test_a_kernel_flooding_its_own_stdout_stays_in_a_capped_sandbox_log(
    oci_runtime: OciRuntime, image_store: ImageStore
) -> None:
    rt = oci_runtime
    image = await image_store.build("code-interpreter", if_missing=True)
    await rt.create(spec("kout", image, execd_token=TOKEN, memory_bytes=1 << 30))
    await wait_ping(rt, "kout")
    host_log = rt.paths("kout").container_log
    before = host_log.stat().st_size
    async with execd_client(rt, "kout", timeout=180,
                            headers={"X-EXECD-ACCESS-TOKEN": TOKEN}) as c:
        r = await c.post("/code", json={"code": FLOOD, "context": {"language": "python"}})
        assert r.status_code == 200, r.text
        events = _events(r.text)
        assert not [e for e in events if e.get("type") == "error"], events
        assert any(e.get("type") == "stdout" and "wrote" in str(e.get("text"))
                   for e in events), events

    grown = host_log.stat().st_size - before
    assert grown < MIB, f"the host-side container log grew by {grown} bytes"
    # The output went to the sandbox's capped log: at most the log and one rotated file.
    r = runc_exec(rt, "kout", "tail -c 100 /run/sandlot/kernels.log; "
                  "cat /run/sandlot/kernels.log* | wc -c; ls /run/sandlot | grep -c kernels.log",
                  token=TOKEN)
    assert "flood-done" in r.stdout, r.stdout + r.stderr
    total, files = (int(x) for x in r.stdout.split()[-2:])
    assert MIB < total <= 16 * MIB
    assert files == 2
