"""``sandlot image ...``: pull, import, build, list, tag and remove local images."""

from __future__ import annotations

import asyncio
import functools
import sys
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    SpinnerColumn,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from sandlot import datadir
from sandlot.config import DEFAULT_DATA_DIR, Config
from sandlot.errors import SandlotError
from sandlot.images.model import Image, RegistryAuth
from sandlot.images.progress import Progress as ImageProgress
from sandlot.images.progress import ProgressFn
from sandlot.images.store import ImageStore

T = TypeVar("T")
err_console = Console(stderr=True)


def _store(data_dir: Path, config_file: Path | None) -> ImageStore:
    cfg = Config.load(config_file)
    # A data dir made here is made as `sandlot serve` wants it (root's alone), so that an
    # image pulled before the first start does not leave one the server then refuses.
    datadir.create(data_dir)
    return ImageStore(data_dir / "images", insecure_registries=cfg.images.insecure_registries)


def store_options(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The options every image command shares: where the store is and which config applies."""
    fn = click.option(
        "--config",
        "config_file",
        type=click.Path(path_type=Path, exists=True, dir_okay=False),
        help="sandlot config file (for [images] insecure_registries).",
    )(fn)
    fn = click.option(
        "--data-dir",
        type=click.Path(path_type=Path, file_okay=False),
        default=DEFAULT_DATA_DIR,
        show_default=True,
        help="sandlot data directory; images live in its images/ folder.",
    )(fn)
    return fn


def _run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        return asyncio.run(coro)
    except SandlotError as exc:
        raise click.ClickException(f"{exc.code}: {exc.message}") from exc


def _errors(fn: Callable[..., T]) -> Callable[..., T]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except SandlotError as exc:
            raise click.ClickException(f"{exc.code}: {exc.message}") from exc

    return wrapper


@contextmanager
def progress_bar(title: str) -> Iterator[ProgressFn]:
    """A rich progress display fed by the store's progress events (on stderr)."""
    columns = [
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[note]}", style="dim"),
    ]
    with Progress(*columns, console=err_console, transient=False) as bar:
        tasks: dict[str, TaskID] = {}

        def on_event(ev: ImageProgress) -> None:
            phase = "download" if ev.phase == "download" else ev.phase
            if phase not in tasks:
                tasks[phase] = bar.add_task(f"{title}: {phase}", total=None, note="")
            task = tasks[phase]
            note = ev.message[-60:] if ev.message else ""
            if ev.total is not None and ev.phase == "download":
                bar.update(task, completed=ev.current, total=ev.total, note=note)
            elif ev.total is not None:
                bar.update(task, note=note or f"{ev.current}/{ev.total}")
            else:
                bar.update(task, note=note)
            if ev.phase == "done":
                for t in tasks.values():
                    bar.update(t, total=bar.tasks[t].total or 1, completed=bar.tasks[t].total or 1)

        yield on_event


def _print_image(img: Image) -> None:
    click.echo(f"{img.name}\t{img.id}")


@click.group()
def image() -> None:
    """Manage the local image store."""


@image.command()
@click.argument("name")
@click.option("--username", "-u", help="Registry user name.")
@click.option("--password", "-p", help="Registry password (prefer --password-stdin).")
@click.option("--password-stdin", is_flag=True, help="Read the registry password from stdin.")
@click.option("--insecure", is_flag=True, help="Use plain HTTP / skip TLS verification.")
@store_options
def pull(
    name: str,
    username: str | None,
    password: str | None,
    password_stdin: bool,
    insecure: bool,
    data_dir: Path,
    config_file: Path | None,
) -> None:
    """Pull NAME (e.g. python:3.12 or host:5000/repo:tag) from its registry."""
    if password_stdin:
        if password is not None:
            raise click.UsageError("--password and --password-stdin exclude each other")
        password = sys.stdin.readline().rstrip("\r\n")
    if (username is None) != (password is None):
        raise click.UsageError("give both --username and a password, or neither")
    auth = RegistryAuth(username, password) if username and password is not None else None
    store = _store(data_dir, config_file)
    with progress_bar(name) as on_event:
        img = _run(store.pull(name, auth=auth, progress=on_event, insecure=insecure))
    _print_image(img)


@image.command("import")
@click.argument("tar", type=click.Path(path_type=Path, exists=True, dir_okay=False))
@click.option("--tag", "-t", required=True, help="Name to give the imported image.")
@store_options
def import_(tar: Path, tag: str, data_dir: Path, config_file: Path | None) -> None:
    """Import a `docker save` archive, an OCI archive or a rootfs tarball as TAG."""
    store = _store(data_dir, config_file)
    with progress_bar(tag) as on_event:
        img = _run(store.import_tar(tar, tag, progress=on_event))
    _print_image(img)


@image.command()
@click.argument("recipe")
@click.option("--if-missing", is_flag=True, help="Skip when all its tags exist (same recipe).")
@store_options
def build(recipe: str, if_missing: bool, data_dir: Path, config_file: Path | None) -> None:
    """Build RECIPE (a shipped recipe name such as `base`, or a path to a TOML recipe)."""
    store = _store(data_dir, config_file)
    with progress_bar(Path(recipe).stem) as on_event:
        img = _run(store.build(recipe, progress=on_event, if_missing=if_missing))
    _print_image(img)


@image.command("ls")
@click.option("--quiet", "-q", is_flag=True, help="Print names only.")
@store_options
@_errors
def ls(quiet: bool, data_dir: Path, config_file: Path | None) -> None:
    """List local images."""
    images = _store(data_dir, config_file).list()
    if quiet:
        for img in images:
            click.echo(img.name)
        return
    table = Table(box=None)
    for col in ("NAME", "IMAGE ID", "SIZE", "CREATED"):
        table.add_column(col)
    for img in images:
        short = img.id.split(":", 1)[-1][:12]
        table.add_row(img.name, short, f"{img.size_bytes / 1e6:.1f} MB", img.created or "")
    Console(width=200).print(table)


@image.command("rm")
@click.argument("names", nargs=-1, required=True)
@store_options
@_errors
def rm(names: tuple[str, ...], data_dir: Path, config_file: Path | None) -> None:
    """Remove images by name (their files go when no other name refers to them)."""
    store = _store(data_dir, config_file)
    for name in names:
        store.remove(name)
        click.echo(f"removed {name}")


@image.command()
@click.argument("source")
@click.argument("target")
@store_options
@_errors
def tag(source: str, target: str, data_dir: Path, config_file: Path | None) -> None:
    """Give the local image SOURCE the additional name TARGET."""
    _print_image(_store(data_dir, config_file).tag(source, target))
