"""``sandlot image ...``: pull, import, build, list and remove local images."""

from __future__ import annotations

import click


@click.group()
def image() -> None:
    """Manage the local image store."""
