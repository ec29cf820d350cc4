"""``sandlot kubernetes ...``: what an operator does once for the kubernetes runtime."""

from __future__ import annotations

from pathlib import Path

import click


@click.group()
def kubernetes() -> None:
    """Tools for [runtime] type = "kubernetes"."""


@kubernetes.command("bundle-image")
@click.option("--output", "-o", type=click.Path(path_type=Path, dir_okay=False), required=True,
              help="Where to write the image (a docker-archive tar).")
@click.option("--data-dir", type=click.Path(path_type=Path, file_okay=False),
              default=Path("/var/lib/sandlot"), show_default=True,
              help="The server's data dir (its execd-bundle cache is used).")
@click.option("--repository", default=None,
              help="Image repository (default sandlot.local/execd-bundle); the tag is the "
                   "bundle's content key.")
def bundle_image(output: Path, data_dir: Path, repository: str | None) -> None:
    """Write sandlot's execd bundle image; prints its name.

    Load it into the nodes (`ctr -n k8s.io images import FILE`) or push it to their
    registry (`skopeo copy docker-archive:FILE docker://REGISTRY/NAME`), then set
    [kubernetes] execd_bundle_image if the name changed.
    """
    from sandlot.runtime.execd_bundle import ensure_bundle
    from sandlot.runtime.kubernetes import bundle_image as images

    bundle = ensure_bundle(data_dir / "execd-bundle")
    name = images.image_name(bundle, repository or images.DEFAULT_REPOSITORY)
    images.write_image(bundle, output, name)
    click.echo(name)
