"""Persistence of sandbox records (SQLite by default, PostgreSQL when configured)."""

from sandlot.server.store.sandboxes import SandboxStore

__all__ = ["SandboxStore"]
