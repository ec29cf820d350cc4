"""The authenticators a configuration asks for, and the start-up checks of tenancy."""

from __future__ import annotations

import logging

from sandlot.config import Config
from sandlot.server.tenancy.authn import ApiKeyAuthenticator, Authenticator
from sandlot.server.tenancy.directory import TenantDirectory, TenantsFileError, tenants_path

log = logging.getLogger(__name__)


def tenant_directory(cfg: Config) -> TenantDirectory | None:
    """The tenants file, read (``TenantsFileError`` when unusable), or None when none is set."""
    path = tenants_path(cfg.tenants.file)
    if path is None:
        return None
    if not path.is_file():
        raise TenantsFileError(f"tenants file {path} does not exist")
    return TenantDirectory(path)


def authenticators_for(cfg: Config) -> list[Authenticator]:
    """Empty only under ``insecure_no_auth`` without keys (every request is the admin).

    Raises ``ValueError`` when no key is configured and insecure mode is not asked for, or
    when tenants are combined with insecure mode (anonymous requests would be the admin).
    """
    directory = tenant_directory(cfg)
    if directory is not None:
        log.info("multi-tenant mode: %d tenants from %s", len(directory.tenants.names),
                 directory.path)
        if cfg.server.insecure_no_auth:
            raise ValueError("tenants cannot be combined with --insecure-no-auth: every "
                             "request without a key would act as the administrator")
    if not cfg.server.api_key and directory is None:
        if not cfg.server.insecure_no_auth:
            raise ValueError("an API key (or a tenants file) is required unless "
                             "server.insecure_no_auth is set")
        return []
    return [ApiKeyAuthenticator(cfg.server.api_key or None, directory)]


def reload_tenants(authenticators: list[Authenticator]) -> None:
    """SIGHUP: re-read the tenants file now (it is also re-read whenever it changes)."""
    for authenticator in authenticators:
        if isinstance(authenticator, ApiKeyAuthenticator) and authenticator.directory:
            authenticator.directory.refresh(force=True)
