"""The bench's raw stream reader counts every text event, wherever the reads split them.

``commands.stream_http`` trusts this count to tell a complete stream from one that lost
output, so it must be exact when an event's end is cut between two reads, and must not
count a text holding quotes, braces or escaped newlines as more than one event.
"""

from __future__ import annotations

import socket
import threading
import time

from bench.benchmarks.commands import _read_stream

from sandlot.execd import sse


def _serve_once(listener: socket.socket, body: bytes, piece: int) -> None:
    conn, _ = listener.accept()
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        request = b""
        while b"\r\n\r\n" not in request:
            request += conn.recv(65536)
        head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        conn.sendall(head)
        chunk = b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body)
        for start in range(0, len(chunk), piece):
            conn.sendall(chunk[start:start + piece])
            time.sleep(0.001)  # separate reads on the other side


def test_every_text_event_is_counted_across_split_reads() -> None:
    output = b'plain\n\n"}\nbraces {"x": "}"}\n' * 4  # quotes, braces, a blank line
    events = sse.encode_data(sse.init_event("id")).encode() + sse.FRAME_END
    frames, lines = sse.encode_region_counted("stdout", output, frames=True)
    events += frames + sse.encode_data(sse.complete_event(5)).encode() + sse.FRAME_END
    for piece in (1, 2, 3, 5, 4096):
        with socket.socket() as listener:
            listener.bind(("127.0.0.1", 0))
            listener.listen(1)
            address = f"127.0.0.1:{listener.getsockname()[1]}"
            server = threading.Thread(target=_serve_once, args=(listener, events, piece))
            server.start()
            _, counted, tail = _read_stream(address, {}, b"{}")
            server.join(10)
        assert counted == lines + 1, piece  # the stdout events and init
        assert tail.endswith(b"0\r\n\r\n") and b"execution_complete" in tail
