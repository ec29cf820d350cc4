"""``sandlot serve``: check the configuration, open the runtime and image store, run uvicorn."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import signal
import socket
import sys

import uvicorn

from sandlot import datadir, hostfs, logsetup
from sandlot.config import API_KEY_ENV, Config
from sandlot.errors import SandlotError
from sandlot.http_deadlines import deadline_protocol
from sandlot.net import hostmode
from sandlot.runtime.base import Runtime
from sandlot.runtime.registry import runtime_class
from sandlot.server import gcfreeze
from sandlot.server.quantity import parse_ephemeral_storage
from sandlot.server.tenancy.directory import TenantsFileError
from sandlot.server.tenancy.setup import reload_tenants, tenant_directory

log = logging.getLogger("sandlot.server")


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
    try:
        runtime_class(cfg.runtime.type)
    except SandlotError as exc:
        raise StartupRefused(exc.message) from exc
    refusals = cfg.refusals()
    if refusals:
        raise StartupRefused("the configuration asks for what this sandlot does not do:\n  "
                             + "\n  ".join(refusals))
    if cfg.runtime.default_ephemeral_storage:
        try:
            parse_ephemeral_storage(cfg.runtime.default_ephemeral_storage)
        except SandlotError as exc:
            raise StartupRefused(f"[runtime] default_ephemeral_storage: {exc.message}") from exc
    for prefix in cfg.storage.allowed_host_paths:
        if not prefix.startswith("/") or prefix.rstrip("/") == "":
            raise StartupRefused(f"[storage] allowed_host_paths: {prefix!r} must be an absolute "
                                 "directory other than '/'")
    if cfg.network.mode == "host" and (why := hostmode.refusal(cfg)):
        raise StartupRefused(why)
    try:
        tenants = tenant_directory(cfg)
    except TenantsFileError as exc:
        raise StartupRefused(str(exc)) from exc
    if tenants is not None and cfg.server.insecure_no_auth:
        raise StartupRefused("a tenants file cannot be combined with --insecure-no-auth: "
                             "requests without a key would act as the administrator")
    if not cfg.server.api_key and tenants is None:
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


async def open_runtime(cfg: Config) -> Runtime:
    """The backend ``[runtime] type`` names, opened (it checks the host itself)."""
    runtime = await runtime_class(cfg.runtime.type).open(cfg)
    caps = runtime.capabilities
    if cfg.network.mode == "host":
        log.warning("!" * 72 + "\n%s\n" + "!" * 72, hostmode.WARNING)
    log.info("runtime %s (isolation: %s; pause: %s%s)", runtime.name, caps.isolation,
             cfg.runtime.pause_mode, ", hibernate available" if caps.hibernate else "")
    sr = cfg.secure_runtime
    if sr.docker_runtime and cfg.runtime.type != "docker":
        log.warning("[secure_runtime] docker_runtime = %r only applies to [runtime] type = "
                    '"docker"; the %s runtime runs gVisor itself', sr.docker_runtime,
                    runtime.name)
    return runtime


def warn_about_data_dir_fs(cfg: Config) -> None:
    """Log a warning when the oci runtime's data dir is on ext4 without a journal (see
    ``sandlot.hostfs``): a choice of the host's, slow for creates after deletes."""
    if cfg.runtime.type != "oci":
        return
    try:
        device = hostfs.ext4_without_journal(cfg.data_dir)
    except OSError:
        return
    if device is not None:
        log.warning("%s; %s", hostfs.journal_advice(cfg.data_dir, device), hostfs.JOURNAL_FIX)


async def _serve(cfg: Config) -> int:
    from sandlot.server.app import create_app

    try:
        datadir.prepare(cfg.data_dir)
        warn_about_data_dir_fs(cfg)
        runtime = await open_runtime(cfg)
    except SandlotError as exc:
        print(f"sandlot serve: {exc.message}", file=sys.stderr)
        return 2
    try:
        app = create_app(cfg, runtime)
        server = uvicorn.Server(
            uvicorn.Config(
                app,
                host=cfg.server.host,
                port=cfg.server.port,
                loop="none",
                http=deadline_protocol(cfg.server.header_timeout_seconds,
                                       cfg.server.body_idle_timeout_seconds),
                timeout_keep_alive=cfg.server.timeout_keep_alive,
                limit_concurrency=cfg.server.limit_concurrency or None,
                backlog=cfg.server.backlog,
                ws="websockets",
                lifespan="on",
                log_config=None,  # logsetup.configure did it, from [log]
                timeout_graceful_shutdown=5,
            )
        )
        # uvicorn re-raises the stop signal once serve() returns; under the default SIGTERM
        # action that would end the process before the runtime is closed (leaking its warm
        # containers), so the re-raised signal is made a no-op here.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, _after_shutdown)
        asyncio.get_running_loop().add_signal_handler(
            signal.SIGHUP, reload_tenants, app.state.authenticators)
        log.debug("garbage collector: %d start-up objects frozen", gcfreeze.freeze_start_up())
        await server.serve()
        return 0 if server.started else 1
    finally:
        await runtime.close()


def _after_shutdown(signum: int, frame: object) -> None:
    """The stop signal, delivered again after uvicorn finished: already being handled."""


def run_server(cfg: Config) -> int:
    """Entry point of ``sandlot serve``; returns the process exit status."""
    try:
        logsetup.configure(cfg.log)
    except (ValueError, OSError) as exc:
        print(f"sandlot serve: {exc}", file=sys.stderr)
        return 2
    try:
        check_config(cfg)
    except StartupRefused as exc:
        print(f"sandlot serve: {exc}", file=sys.stderr)
        return 2
    for warning in cfg.warnings():
        log.warning("config: %s", warning)
    try:
        import uvloop

        return uvloop.run(_serve(cfg))
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        return asyncio.run(_serve(cfg))
    except KeyboardInterrupt:
        return 0
