"""execd's wire constants, shared by execd and by the host-side client (``execd_client``).

Standard library only: the server imports it without pulling in execd's dependencies.
"""

from __future__ import annotations

DEFAULT_PORT = 44772
TOKEN_HEADER = "X-EXECD-ACCESS-TOKEN"
PING_PATH = "/ping"
CLAIM_PATH = "/_sandlot/claim"  # a pooled execd's one-time hand-over (execd/claim.py)
