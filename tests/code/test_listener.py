"""``kernels.listener.SocketListener``: messages reach the handler from the loop's own poll
(a run sets its handler in the step that sends its request, so none of its messages is
missed); messages that arrive while no handler listens are dropped, not kept."""

from __future__ import annotations

import asyncio
from typing import Any

import zmq
import zmq.asyncio
from jupyter_client.session import Session

from sandlot.execd.code.kernels.listener import SocketListener


def test_listener_hands_messages_to_the_handler_until_it_is_done() -> None:
    async def scenario() -> tuple[list[str], bool]:
        ctx = zmq.asyncio.Context()
        session = Session(key=b"secret")
        pub = ctx.socket(zmq.PUB)
        port = pub.bind_to_random_port("tcp://127.0.0.1")
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(f"tcp://127.0.0.1:{port}")
        listener = SocketListener(sub, session)
        try:
            first = listener.first()
            while not first.done():  # the slow joiner: publish until one arrives
                session.send(pub, "status", {"execution_state": "idle"})
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.05)
            listener.listen(None)
            session.send(pub, "stream", {"name": "stdout", "text": "dropped"})
            await asyncio.sleep(0.05)
            seen: list[str] = []
            done = asyncio.get_running_loop().create_future()

            def handle(msg: dict[str, Any]) -> bool:
                seen.append(msg["msg_type"])
                if msg["msg_type"] == "status":
                    done.set_result(None)
                    return True
                return False

            session.send(pub, "execute_input", {"code": "1+1", "execution_count": 1})
            listener.listen(handle)  # in the same step, as a run does
            session.send(pub, "execute_result", {"data": {"text/plain": "2"}})
            session.send(pub, "status", {"execution_state": "idle"})
            session.send(pub, "stream", {"name": "stdout", "text": "after"})
            await asyncio.wait_for(done, 5)
            await asyncio.sleep(0.05)
            return seen, first.done()
        finally:
            listener.close()
            pub.close(linger=0)
            ctx.term()

    seen, got_first = asyncio.run(scenario())
    assert got_first
    assert seen == ["execute_input", "execute_result", "status"]
