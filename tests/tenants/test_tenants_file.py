"""The tenants file: parsing, hashed keys, and re-reading it on change (no restart)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sandlot.server.tenancy.directory import TenantDirectory, TenantsFileError, parse
from sandlot.server.tenancy.keys import digest, hashed

KEY_A = "key-of-team-a-0123456789"
KEY_B = "key-of-team-b-0123456789"


def write(path: Path, text: str) -> None:
    """Replace the file as editors and ConfigMaps do (a new inode)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_plaintext_and_hashed_keys_map_to_their_tenant() -> None:
    tenants = parse({"tenants": [
        {"name": "team-a", "namespace": "ns-a", "api_keys": [KEY_A],
         "quota": {"sandboxes": 2, "cpu": "1500m", "memory": "1Gi"}},
        {"name": "team-b", "api_keys": [hashed(KEY_B)]},
    ], "admin": {"api_keys": [hashed("an-admin-key-0123456789")]}})
    a = tenants.by_digest[digest(KEY_A)]
    assert (a.name, a.admin, a.namespace) == ("team-a", False, "ns-a")
    assert (a.quota.sandboxes, a.quota.cpu, a.quota.memory) == (2, 1.5, 1 << 30)
    assert tenants.by_digest[digest(KEY_B)].name == "team-b"
    assert tenants.by_digest[digest("an-admin-key-0123456789")].admin
    # Only digests are kept: no plaintext key anywhere in what was parsed.
    assert KEY_A not in repr(tenants)
    assert any("namespace" in w for w in tenants.warnings)


@pytest.mark.parametrize(("data", "words"), [
    ({"tenants": [{"name": "a", "api_keys": [KEY_A]}, {"name": "b", "api_keys": [KEY_A]}]},
     "both"),
    ({"tenants": [{"name": "a", "api_keys": [KEY_A]}, {"name": "a", "api_keys": [KEY_B]}]},
     "twice"),
    ({"tenants": [{"name": "a", "api_keys": []}]}, "non-empty"),
    ({"tenants": [{"name": "a", "api_keys": ["sha256:abc"]}]}, "64 hex"),
    ({"tenants": [{"name": "a", "api_keys": [KEY_A], "quota": {"gpus": 1}}]}, "gpus"),
    ({"tenants": [{"name": "a", "api_keys": [KEY_A], "quota": {"cpu": "lots"}}]}, "quota"),
    ({"tenants": [{"name": "a", "api_keys": [KEY_A], "rate": 5}]}, "rate"),
    ({"tenants": [{"name": "", "api_keys": [KEY_A]}]}, "name"),
    ({"tenant": []}, "unknown top-level"),
])
def test_unusable_files_are_refused_with_the_reason(data: dict, words: str) -> None:
    with pytest.raises(TenantsFileError, match=words):
        parse(data)


def test_changes_are_picked_up_without_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    write(path, f'[[tenants]]\nname = "team-a"\napi_keys = ["{KEY_A}"]\n')
    directory = TenantDirectory(path)
    assert directory.lookup(digest(KEY_A)).name == "team-a"  # type: ignore[union-attr]
    # Rotation, step 1: the new key beside the old; both work.
    write(path, f'[[tenants]]\nname = "team-a"\napi_keys = ["{KEY_A}", "{hashed(KEY_B)}"]\n')
    assert directory.lookup(digest(KEY_A)) is not None
    assert directory.lookup(digest(KEY_B)).name == "team-a"  # type: ignore[union-attr]
    # Step 2: the old key removed.
    write(path, f'[[tenants]]\nname = "team-a"\napi_keys = ["{hashed(KEY_B)}"]\n')
    assert directory.lookup(digest(KEY_A)) is None
    assert directory.lookup(digest(KEY_B)) is not None
    # A broken edit keeps what worked.
    write(path, "[[tenants]\nname = ")
    assert directory.lookup(digest(KEY_B)) is not None
    # A removed file drops every tenant key (as on the reference).
    path.unlink()
    assert directory.lookup(digest(KEY_B)) is None


def test_a_bad_file_at_start_is_an_error(tmp_path: Path) -> None:
    path = tmp_path / "tenants.toml"
    path.write_text('[[tenants]]\nname = "x"\n')
    with pytest.raises(TenantsFileError, match="api_keys"):
        TenantDirectory(path)
