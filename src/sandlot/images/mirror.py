"""Which Debian mirror to bootstrap from: the one the host's apt already uses."""

from __future__ import annotations

from pathlib import Path

FALLBACK_MIRROR = "http://deb.debian.org/debian"


def _uris_one_line(text: str) -> list[str]:
    out = []
    for line in text.splitlines():
        words = line.split("#", 1)[0].split()
        if len(words) >= 3 and words[0] == "deb":
            rest = words[1:]
            if rest[0].startswith("["):  # options like [signed-by=...]
                while rest and not rest[0].endswith("]"):
                    rest = rest[1:]
                rest = rest[1:]
            if rest:
                out.append(rest[0])
    return out


def _uris_deb822(text: str) -> list[str]:
    out: list[str] = []
    for stanza in text.split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, _, value = line.partition(":")
            fields[key.strip().lower()] = value.strip()
        if fields.get("enabled", "yes").lower() == "no":
            continue
        if "deb" in fields.get("types", "").split():
            out.extend(fields.get("uris", "").split())
    return out


def host_debian_mirror(etc_apt: Path = Path("/etc/apt")) -> str:
    """The first Debian (non-security) archive URI in the host's apt sources, else the CDN."""
    uris: list[str] = []
    files = [etc_apt / "sources.list"]
    listdir = etc_apt / "sources.list.d"
    if listdir.is_dir():
        files += sorted(listdir.iterdir())
    for f in files:
        try:
            text = f.read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        if f.name.endswith(".list"):
            uris += _uris_one_line(text)
        elif f.name.endswith(".sources"):
            uris += _uris_deb822(text)
    for uri in uris:
        clean = uri.rstrip("/")
        if clean.startswith(("http://", "https://")) and clean.endswith("/debian"):
            return clean
    return FALLBACK_MIRROR
