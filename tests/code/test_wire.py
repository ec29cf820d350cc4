"""``kernels.wire.parse``: a kernel message read as a run needs it, signature checked."""

from __future__ import annotations

import pytest
from jupyter_client.session import Session

from sandlot.execd.code.kernels import wire


def _frames(session: Session, msg_type: str, content: dict, parent: dict | None = None,
            version: str | None = None) -> list[bytes]:
    msg = session.msg(msg_type, content=content, parent=parent)
    if version is not None:
        msg["header"]["version"] = version
    return session.serialize(msg, ident=b"kernel.abc.execute_result")


def test_parse_reads_type_parent_and_content():
    session = Session(key=b"secret")
    parent = session.msg("execute_request", content={"code": "1+1"})
    frames = _frames(session, "execute_result", {"data": {"text/plain": "2"},
                                                 "execution_count": 4}, parent["header"])
    msg = wire.parse(session, frames)
    assert msg["msg_type"] == "execute_result"
    assert msg["parent_header"]["msg_id"] == parent["header"]["msg_id"]
    assert msg["content"] == {"data": {"text/plain": "2"}, "execution_count": 4}
    # dates stay as sent (strings): a run never reads them
    assert isinstance(msg["parent_header"]["date"], str)


def test_parse_refuses_a_wrong_or_missing_signature():
    session = Session(key=b"secret")
    frames = _frames(session, "stream", {"name": "stdout", "text": "hi"})
    with pytest.raises(ValueError, match="Invalid Signature"):
        wire.parse(Session(key=b"other"), frames)
    unsigned = list(frames)
    unsigned[unsigned.index(b"<IDS|MSG>") + 1] = b""
    with pytest.raises(ValueError, match="Unsigned"):
        wire.parse(session, unsigned)


def test_parse_hands_other_protocol_versions_to_the_session():
    """A protocol 4 message is adapted by ``Session.deserialize`` (as before this reader)."""
    session = Session(key=b"secret")
    frames = _frames(session, "pyout", {"data": {"text/plain": "2"}, "prompt_number": 3},
                     version="4.1")
    msg = wire.parse(session, frames)
    assert msg["msg_type"] == "execute_result"  # v4's pyout, renamed by the adapter
    assert msg["content"]["data"] == {"text/plain": "2"}
