"""The ``sandlot`` command: serve, init-config, image management and the execd daemon."""

from __future__ import annotations

import secrets
import sys
from pathlib import Path

import click

from sandlot import __version__, datadir
from sandlot.config import CONFIG_TEMPLATE, Config


def load_config(config_file: Path | None, data_dir: Path | None) -> Config:
    cfg = Config.load(config_file)
    if data_dir is not None:
        cfg.data_dir = data_dir
    return cfg


@click.group()
@click.version_option(__version__, prog_name="sandlot")
def main() -> None:
    """sandlot: sandboxes for AI agents, compatible with OpenSandbox."""


@main.command()
@click.option(
    "--config", "config_file", type=click.Path(path_type=Path, exists=True, dir_okay=False)
)
@click.option("--host", help="Address to listen on (default from config: 127.0.0.1).")
@click.option("--port", type=int, help="Port to listen on (default from config: 8080).")
@click.option("--data-dir", type=click.Path(path_type=Path, file_okay=False))
@click.option(
    "--insecure-no-auth",
    is_flag=True,
    help="Run without an API key. Only allowed on loopback addresses.",
)
def serve(
    config_file: Path | None,
    host: str | None,
    port: int | None,
    data_dir: Path | None,
    insecure_no_auth: bool,
) -> None:
    """Run the lifecycle server."""
    from sandlot.server.main import run_server

    cfg = load_config(config_file, data_dir)
    if host:
        cfg.server.host = host
    if port:
        cfg.server.port = port
    if insecure_no_auth:
        cfg.server.insecure_no_auth = True
    sys.exit(run_server(cfg))


@main.command()
@click.option(
    "--config", "config_file", type=click.Path(path_type=Path, exists=True, dir_okay=False)
)
@click.option("--data-dir", type=click.Path(path_type=Path, file_okay=False))
def doctor(config_file: Path | None, data_dir: Path | None) -> None:
    """Check this host for what sandlot needs; exit 1 if the configured runtime cannot work."""
    from rich.console import Console

    from sandlot.cli.doctor import exit_status, render, run_checks

    cfg = load_config(config_file, data_dir)
    checks = run_checks(cfg)
    render(checks, cfg, Console())
    sys.exit(exit_status(checks))


@main.command("init-config")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--force", is_flag=True, help="Overwrite an existing file.")
def init_config(file: Path, force: bool) -> None:
    """Write a commented config file with a fresh random API key."""
    if file.exists() and not force:
        raise click.ClickException(f"{file} exists; use --force to overwrite it")
    datadir.create(file.parent)  # the default folder is the data dir (/var/lib/sandlot)
    file.write_text(CONFIG_TEMPLATE.replace("{api_key}", secrets.token_urlsafe(32)))
    file.chmod(0o600)
    click.echo(f"wrote {file}")


@main.command("hash-key")
@click.option("--new", is_flag=True, help="Make a fresh random key and print it too.")
def hash_key(new: bool) -> None:
    """Print the sha256: form of an API key (read from stdin) for a tenants file."""
    from sandlot.server.tenancy.keys import hashed

    if new:
        key = secrets.token_urlsafe(32)
        click.echo(f"key:  {key}")
        click.echo(f"hash: {hashed(key)}")
        return
    key = sys.stdin.readline().strip()
    if not key:
        raise click.ClickException("no key on stdin")
    click.echo(hashed(key))


@main.command(
    "execd",
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    add_help_option=False,
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def execd(args: tuple[str, ...]) -> None:
    """Run the in-sandbox execution daemon (see `sandlot execd --help`)."""
    from sandlot.execd.main import main as execd_main

    sys.exit(execd_main(list(args)))


def _register_image_commands() -> None:
    from sandlot.cli.image import image

    main.add_command(image)
    from sandlot.cli.kubernetes import kubernetes

    main.add_command(kubernetes)


_register_image_commands()

if __name__ == "__main__":
    main()
