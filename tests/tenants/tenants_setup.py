"""Keys and a tenants file shared by the tenant tests."""

from __future__ import annotations

import os
from pathlib import Path

from sandlot.server.tenancy.keys import hashed

KEY_A = "team-a-key-0123456789abcdef"
KEY_B = "team-b-key-0123456789abcdef"
KEY_A2 = "team-a-rotated-key-0123456789"
# team-a: at most 2 sandboxes, 1 core and 1 GiB in total; team-b: no quota. team-b's key is
# given as its digest (the plaintext never appears in the file).
QUOTA_A = '{ sandboxes = 2, cpu = "1", memory = "1Gi" }'


def tenants_toml(a_keys: list[str] | None = None) -> str:
    keys = ", ".join(f'"{k}"' for k in (a_keys or [KEY_A]))
    return (f'[[tenants]]\nname = "team-a"\nnamespace = "ns-a"\napi_keys = [{keys}]\n'
            f"quota = {QUOTA_A}\n\n"
            f'[[tenants]]\nname = "team-b"\napi_keys = ["{hashed(KEY_B)}"]\n')


def write_tenants(path: Path, text: str) -> None:
    """Replace the file atomically, as an editor or a ConfigMap update does."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_text(text)
    os.replace(tmp, path)
