"""Metadata keys and values follow Kubernetes label rules, as on the reference server.

The reference stores metadata as container/pod labels and refuses what a label cannot hold;
sandlot refuses the same, so metadata that works here also works there and the reverse.
"""

from __future__ import annotations

import re

from sandlot.errors import InvalidRequest
from sandlot.server import codes

RESERVED_PREFIX = "opensandbox.io/"
_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"(?:{_DNS_LABEL}\.)*{_DNS_LABEL}")
_MAX_NAME = 63
_MAX_PREFIX = 253
_MAX_VALUE = 63


def is_reserved(key: str) -> bool:
    return key.startswith(RESERVED_PREFIX)


def valid_key(key: str) -> bool:
    """``name`` or ``prefix/name``: name up to 63 label characters, prefix a DNS subdomain."""
    name = key
    if "/" in key:
        prefix, _, name = key.partition("/")
        if not prefix or not name or len(prefix) > _MAX_PREFIX:
            return False
        if not _DNS_SUBDOMAIN.fullmatch(prefix):
            return False
    return len(name) <= _MAX_NAME and bool(_NAME.fullmatch(name))


def valid_value(value: str) -> bool:
    """Empty, or up to 63 characters that start and end alphanumeric."""
    return value == "" or (len(value) <= _MAX_VALUE and bool(_NAME.fullmatch(value)))


def check_metadata(metadata: dict[str, str]) -> None:
    """Refuse the first key or value a label cannot hold (400 SANDBOX::INVALID_METADATA_LABEL)."""
    for key, value in metadata.items():
        if is_reserved(key):
            raise InvalidRequest(
                f"Metadata key '{key}' uses the reserved prefix '{RESERVED_PREFIX}'; keys under "
                "it are set by the server, not through metadata.",
                code=codes.INVALID_METADATA_LABEL,
            )
        if not valid_key(key):
            raise InvalidRequest(
                f"Metadata key '{key}' is invalid: use a name of up to 63 characters matching "
                "[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?, optionally after a DNS-subdomain "
                "prefix (up to 253 characters) and a '/'.",
                code=codes.INVALID_METADATA_LABEL,
            )
        if not valid_value(value):
            raise InvalidRequest(
                f"Metadata value '{value}' is invalid: at most 63 characters, starting and "
                "ending with a letter or digit, with only letters, digits, '-', '_' or '.'.",
                code=codes.INVALID_METADATA_LABEL,
            )
