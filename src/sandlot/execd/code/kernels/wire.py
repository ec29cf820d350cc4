"""A kernel's messages as a run needs them: signed, unpacked, and nothing more.

``Session.deserialize`` also parses the header's and parent header's dates (``dateutil``
per date), records each signature for replay detection and adapts old protocol versions:
in a py-spy profile of warm ``1+1`` runs those were about a tenth of execd's CPU, for
fields a run never reads (it needs the message type, the parent's id and the content).
Here the signature is still checked (HMAC over the same frames, with the session's key),
the three JSON parts are unpacked with the session's unpacker, and any message of another
major protocol version than 5 goes through ``Session.deserialize`` as before.
"""

from __future__ import annotations

from hmac import compare_digest
from typing import Any

# The protocol major version these messages are read as (ipykernel 5 and later speak it).
PROTOCOL_MAJOR = "5"


def parse(session: Any, frames: list[bytes]) -> dict[str, Any]:
    """The message in ``frames`` (as received, identities first) with ``msg_type``,
    ``header``, ``parent_header`` (dates left as strings) and ``content``.

    Raises ``ValueError`` for an unsigned or wrongly signed message, as ``deserialize``."""
    _idents, parts = session.feed_identities(frames)
    if len(parts) < 5:
        raise TypeError("malformed message, must have at least 5 elements")
    if session.auth is not None:
        if not parts[0]:
            raise ValueError("Unsigned Message")
        if not compare_digest(parts[0], session.sign(parts[1:5])):
            raise ValueError(f"Invalid Signature: {parts[0]!r}")
    header = session.unpack(parts[1])
    if str(header.get("version", "")).partition(".")[0] != PROTOCOL_MAJOR:
        deserialized: dict[str, Any] = session.deserialize(parts)
        return deserialized
    return {
        "msg_type": header["msg_type"],
        "header": header,
        "parent_header": session.unpack(parts[2]),
        "content": session.unpack(parts[4]),
    }
