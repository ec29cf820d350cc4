"""Jupyter messages (protocol v5) as the WebSocket carries them: JSON objects with a ``channel``.

This is Jupyter Server's default ("legacy") WebSocket framing; binary buffers are not carried
(no kernel sandlot offers sends them except widget extensions, whose buffers are dropped).
"""

from __future__ import annotations

import json
from typing import Any

from jupyter_client.jsonutil import json_default
from jupyter_client.session import Session

PROTOCOL_VERSION = "5.3"

# Messages sandlot makes itself (native kernels, kernel-death notices) are not signed: they only
# travel over the WebSocket, which carries no signatures.
_SESSION = Session(key=b"", username="sandlot")


def make(msg_type: str, content: dict[str, Any], parent: dict[str, Any] | None,
         channel: str) -> dict[str, Any]:
    msg = _SESSION.msg(msg_type, content, parent=parent or {})
    msg["header"]["version"] = PROTOCOL_VERSION
    msg["channel"] = channel
    msg["buffers"] = []
    return msg


def encode(msg: dict[str, Any]) -> str:
    """A message as one text frame (dates as ISO 8601, as Jupyter Server sends them)."""
    out = {k: v for k, v in msg.items() if k != "buffers"}
    out["buffers"] = []
    return json.dumps(out, default=json_default)


def decode(text: str) -> dict[str, Any]:
    msg = json.loads(text)
    if not isinstance(msg, dict) or not isinstance(msg.get("header"), dict):
        raise ValueError("not a Jupyter message (an object with a header)")
    msg.setdefault("parent_header", {})
    msg.setdefault("metadata", {})
    msg.setdefault("content", {})
    return msg


def status(state: str, parent: dict[str, Any] | None) -> dict[str, Any]:
    return make("status", {"execution_state": state}, parent, "iopub")


def died_messages(
    request: dict[str, Any], ename: str, evalue: str, execution_count: int | None
) -> list[dict[str, Any]]:
    """What a client waiting on ``request`` (an execute_request) is told when the kernel died."""
    parent = request["header"]
    traceback = [f"{ename}: {evalue}"]
    error = {"ename": ename, "evalue": evalue, "traceback": traceback}
    return [
        make("error", error, parent, "iopub"),
        make("execute_reply", {"status": "error", "execution_count": execution_count, **error},
             parent, "shell"),
        status("idle", parent),
    ]
