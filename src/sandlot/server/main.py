"""``sandlot serve``: check the configuration, open the runtime and image store, run uvicorn."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
import socket
import sys
import uuid

import uvicorn

from sandlot.config import API_KEY_ENV, Config

log = logging.getLogger("sandlot.server")
_MAX_UNIX_PATH = 107  # sun_path is 108 bytes including the terminating NUL


class StartupRefused(Exception):
    """The configuration is unsafe or asks for something this build cannot do."""


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, None)
        except OSError:
            return False
        return all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def check_config(cfg: Config) -> None:
    if cfg.runtime.type in ("docker", "kubernetes"):
        raise StartupRefused(
            f"runtime type {cfg.runtime.type!r} is not available in this sandlot yet; "
            'use [runtime] type = "oci" (the default)'
        )
    if not cfg.server.api_key:
        if not cfg.server.insecure_no_auth:
            raise StartupRefused(
                "no API key configured: set [server] api_key in the config file or "
                f"{API_KEY_ENV} in the environment (run `sandlot init-config FILE` to make one), "
                "or pass --insecure-no-auth to run without authentication on loopback only"
            )
        if not _is_loopback(cfg.server.host):
            raise StartupRefused(
                f"--insecure-no-auth only binds loopback addresses, not {cfg.server.host!r}; "
                "use --host 127.0.0.1 or configure an API key"
            )


async def _open_backends(cfg: Config):  # type: ignore[no-untyped-def]
    from sandlot.images.store import ImageStore
    from sandlot.runtime.oci import OciRuntime

    images = ImageStore(
        root=cfg.data_dir / "images", insecure_registries=cfg.images.insecure_registries
    )
    runtime = await OciRuntime.open(cfg)
    return runtime, images


async def _serve(cfg: Config) -> int:
    from sandlot.server.app import create_app

    cfg.data_dir.mkdir(parents=True, exist_ok=True)
    runtime, images = await _open_backends(cfg)
    try:
        probe = runtime.execd_socket(str(uuid.UUID(int=0)))
        if len(str(probe).encode()) > _MAX_UNIX_PATH:
            print(
                f"sandlot serve: data dir {cfg.data_dir} is too long: sandbox sockets such as "
                f"{probe} exceed the {_MAX_UNIX_PATH}-byte unix socket limit; use a shorter "
                "--data-dir",
                file=sys.stderr,
            )
            return 2
        app = create_app(cfg, runtime, images)
        server = uvicorn.Server(
            uvicorn.Config(
                app,
                host=cfg.server.host,
                port=cfg.server.port,
                loop="none",
                http="httptools",
                ws="websockets",
                lifespan="on",
                log_level="info",
                timeout_graceful_shutdown=5,
            )
        )
        # uvicorn re-raises the stop signal once serve() returns; under the default SIGTERM
        # action that would end the process before the runtime is closed (leaking its warm
        # containers), so the re-raised signal is made a no-op here.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _after_shutdown)
        await server.serve()
        return 0 if server.started else 1
    finally:
        await runtime.close()
        close = getattr(images, "close", None)
        if close is not None:
            result = close()
            if asyncio.iscoroutine(result):
                await result


def _after_shutdown(signum: int, frame: object) -> None:
    """The stop signal, delivered again after uvicorn finished: already being handled."""


def run_server(cfg: Config) -> int:
    """Entry point of ``sandlot serve``; returns the process exit status."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per proxied request
    try:
        check_config(cfg)
    except StartupRefused as exc:
        print(f"sandlot serve: {exc}", file=sys.stderr)
        return 2
    try:
        import uvloop

        return uvloop.run(_serve(cfg))
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        return asyncio.run(_serve(cfg))
    except KeyboardInterrupt:
        return 0
