"""``kernels.ready.wait_ready`` on real kernels: once it returns, a first cell's output is
not lost (iopub is subscribed), and a kernel that died is reported, not waited for. Beside
them a stand-in kernel whose shell never reads its first connection: readiness gets it an
answer on a new connection instead of waiting out its timeout."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest
import zmq
import zmq.asyncio
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager
from jupyter_client.session import Session

from sandlot.execd.code.kernels import ready
from sandlot.execd.code.kernels.jupyter import CHANNELS
from sandlot.execd.code.kernels.listener import SocketListener


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


async def _stand_in_kernel(router: Any, pub: Any, session: Session, peers: list[bytes]) -> None:
    """A kernel's shell and iopub: iopub talks (a status for each request: the kernel runs)
    but the shell never answers its first peer (as a ROUTER that lost its wake-up, the
    requests sitting unread while the kernel idles); every later peer is answered."""
    while True:
        frames = await router.recv_multipart()
        idents, rest = session.feed_identities(frames)
        if idents[0] not in peers:
            peers.append(idents[0])
        request = session.deserialize(rest)
        session.send(pub, "status", {"execution_state": "busy"}, parent=request)
        if idents[0] != peers[0]:
            session.send(router, "kernel_info_reply", {"status": "ok"}, parent=request,
                         ident=idents)


async def _wait_on_stand_in(timeout: float) -> list[bytes]:
    ctx = zmq.asyncio.Context()
    session = Session(key=b"stand-in")
    router, pub = ctx.socket(zmq.ROUTER), ctx.socket(zmq.PUB)
    kc = AsyncKernelClient(ip="127.0.0.1", transport="tcp", session=session, context=ctx,
                           shell_port=router.bind_to_random_port("tcp://127.0.0.1"),
                           iopub_port=pub.bind_to_random_port("tcp://127.0.0.1"))
    peers: list[bytes] = []
    kernel = asyncio.create_task(_stand_in_kernel(router, pub, session, peers))
    listener = SocketListener(kc.connect_iopub(), session)

    async def alive() -> bool:
        return True

    try:
        await ready.wait_ready(kc, timeout, alive, iopub=listener.first)
    finally:
        kernel.cancel()
        listener.close()
        router.close(linger=0)
        pub.close(linger=0)
        ctx.term()
    return peers


async def test_a_shell_that_never_reads_a_connection_is_asked_on_a_new_one(monkeypatch):
    monkeypatch.setattr(ready, "REOPEN_AFTER", 0.5)
    monkeypatch.setattr(ready, "REOPEN_IDLE", math.inf)  # only iopub's sign of life reopens
    peers = await _wait_on_stand_in(timeout=20)
    assert len(peers) >= 2  # ready thanks to a later connection, the first never answered


async def test_without_a_new_connection_the_stuck_shell_is_a_timeout(monkeypatch):
    """The counterpart: on its first connection alone the stand-in never answers, so the
    test above passes only because readiness opened another."""
    monkeypatch.setattr(ready, "REOPEN_AFTER", math.inf)
    monkeypatch.setattr(ready, "REOPEN_IDLE", math.inf)
    with pytest.raises(RuntimeError, match=r"\(no shell reply; \d+ kernel_info requests "
                                           r"on 1 shell connection"):
        await _wait_on_stand_in(timeout=2)
