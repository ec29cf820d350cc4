"""Docker-style image references: parse them and give each one canonical spelling.

``python:3.12`` and ``docker.io/library/python:3.12`` name the same image; the store keys
tags by the canonical form so that either spelling finds it. The grammar follows the
distribution project's reference format (a few lines of regex; no well-kept Python library
for it exists that is worth a dependency).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from sandlot.errors import InvalidRequest

DEFAULT_DOMAIN = "docker.io"
DEFAULT_TAG = "latest"

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_PATH_RE = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
_DOMAIN_RE = re.compile(
    r"^(?:localhost|\[[0-9a-fA-F:]+\]|[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
    r"(?:\.[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?)*)(?::[0-9]+)?$"
)
_TAG_RE = re.compile(r"^[\w][\w.-]{0,127}$")
_DIGEST_RE = re.compile(r"^[a-z0-9]+(?:[.+_-][a-z0-9]+)*:[a-fA-F0-9]{32,}$")


@dataclass(frozen=True)
class Reference:
    """A parsed reference: ``domain/path[:tag][@digest]``, canonical fields filled in."""

    domain: str
    path: str
    tag: str | None
    digest: str | None

    @property
    def repository(self) -> str:
        return f"{self.domain}/{self.path}"

    @property
    def canonical(self) -> str:
        """The key the store uses: always with domain, and with a tag unless pinned by digest."""
        out = self.repository
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out

    @property
    def host(self) -> str:
        """The registry host without port (for loopback and insecure checks)."""
        d = self.domain
        if d.startswith("["):
            return d[1 : d.index("]")]
        return d.rsplit(":", 1)[0] if ":" in d else d

    @property
    def transport_ref(self) -> str:
        """What skopeo's ``docker://`` transport is given (digest wins over tag)."""
        if self.digest:
            return f"{self.repository}@{self.digest}"
        return f"{self.repository}:{self.tag or DEFAULT_TAG}"

    def is_loopback(self) -> bool:
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def parse_reference(ref: str) -> Reference:
    """Parse ``ref``; raise InvalidRequest with the reason when it is not a valid reference."""
    text = ref.strip()
    if not text:
        raise InvalidRequest("image reference is empty")
    rest, digest = text, None
    if "@" in rest:
        rest, digest = rest.split("@", 1)
        if not _DIGEST_RE.match(digest):
            raise InvalidRequest(f"invalid digest in image reference {ref!r}")
    tag = None
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > slash:
        rest, tag = rest[:colon], rest[colon + 1 :]
        if not _TAG_RE.match(tag):
            raise InvalidRequest(f"invalid tag {tag!r} in image reference {ref!r}")
    first, _, remainder = rest.partition("/")
    looks_like_host = "." in first or ":" in first or first == "localhost" or first[:1] == "["
    if remainder and looks_like_host:
        domain, path = first, remainder
        if not _DOMAIN_RE.match(domain):
            raise InvalidRequest(f"invalid registry host {domain!r} in image reference {ref!r}")
    else:
        domain, path = DEFAULT_DOMAIN, rest
    if domain in ("index.docker.io", "registry-1.docker.io"):
        domain = DEFAULT_DOMAIN
    if domain == DEFAULT_DOMAIN and "/" not in path:
        path = f"library/{path}"
    if not _PATH_RE.match(path):
        raise InvalidRequest(
            f"invalid image name {ref!r}: repository names are lower-case letters, digits "
            "and separators (. _ -), with / between components"
        )
    if tag is None and digest is None:
        tag = DEFAULT_TAG
    return Reference(domain=domain, path=path, tag=tag, digest=digest)


def canonical_name(ref: str) -> str:
    return parse_reference(ref).canonical
