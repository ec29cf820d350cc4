"""The per-sandbox token of the Jupyter API a code-interpreter sandbox serves on port 44771.

Derived from the sandbox's execd access token with HMAC, so the server (which hands it out as an
endpoint header) and execd (which checks it) agree without storing anything more, and holding the
Jupyter token does not give execd's (a notebook client only gets the narrower one).
"""

from __future__ import annotations

import hashlib
import hmac

JUPYTER_PORT = 44771
_PURPOSE = b"sandlot jupyter api token v1"


def jupyter_token(execd_token: str) -> str:
    return hmac.new(execd_token.encode(), _PURPOSE, hashlib.sha256).hexdigest()[:48]


def endpoint_headers(execd_token: str) -> dict[str, str]:
    """What a client of the Jupyter port sends, as Jupyter clients send a token."""
    return {"Authorization": f"token {jupyter_token(execd_token)}"}
