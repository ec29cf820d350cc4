"""``kernels.ready.wait_ready`` on real kernels: once it returns, a first cell's output is
not lost (iopub is subscribed), and a kernel that died is reported, not waited for."""

from __future__ import annotations

import pytest
from jupyter_client.manager import AsyncKernelManager

from sandlot.execd.code.kernels import ready
from sandlot.execd.code.kernels.jupyter import CHANNELS


async def test_a_ready_kernel_delivers_the_first_cells_output():
    km = AsyncKernelManager(kernel_name="python3")
    await km.start_kernel()
    kc = km.client()
    kc.start_channels(**CHANNELS)
    try:
        await ready.wait_ready(kc, 60, km.is_alive)
        msg_id = kc.execute("print('first'); 6 * 7")
        seen: dict[str, object] = {}
        while "execute_result" not in seen or "stream" not in seen:
            msg = await kc.get_iopub_msg(timeout=30)
            if msg["parent_header"].get("msg_id") == msg_id:
                seen[msg["msg_type"]] = msg["content"]
        assert seen["stream"]["text"] == "first\n"  # type: ignore[index]
        assert seen["execute_result"]["data"]["text/plain"] == "42"  # type: ignore[index]
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)


async def test_a_dead_kernel_is_reported():
    km = AsyncKernelManager(kernel_name="python3")
    await km.start_kernel()
    kc = km.client()
    kc.start_channels(**CHANNELS)
    try:
        await km.signal_kernel(9)
        await km.provisioner.wait()  # type: ignore[union-attr]
        with pytest.raises(RuntimeError, match="died"):
            await ready.wait_ready(kc, 60, km.is_alive)
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)
