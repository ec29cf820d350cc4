"""Request bodies and response shapes of the lifecycle contract (sandbox-lifecycle.yml)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sandlot.server.models import SandboxRecord


class _Body(BaseModel):
    # Unknown fields are ignored: newer clients may send fields this server predates.
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class ImageAuth(_Body):
    username: str
    password: str


class ImageSpec(_Body):
    uri: str = Field(min_length=1)
    auth: ImageAuth | None = None


class PlatformSpec(_Body):
    os: str
    arch: str


class CreateSandboxRequest(_Body):
    image: ImageSpec | None = None
    snapshot_id: str | None = Field(default=None, alias="snapshotId")
    template_id: str | None = Field(default=None, alias="templateId")
    platform: PlatformSpec | None = None
    timeout: int | None = Field(default=None, ge=60)
    resource_limits: dict[str, str] = Field(default_factory=dict, alias="resourceLimits")
    resource_requests: dict[str, str] | None = Field(default=None, alias="resourceRequests")
    env: dict[str, str] = Field(default_factory=dict)
    metadata: dict[str, str] = Field(default_factory=dict)
    entrypoint: list[str] | None = Field(default=None, min_length=1)
    network_policy: dict[str, Any] | None = Field(default=None, alias="networkPolicy")
    credential_proxy: dict[str, Any] | None = Field(default=None, alias="credentialProxy")
    secure_access: bool = Field(default=False, alias="secureAccess")
    volumes: list[dict[str, Any]] | None = None
    extensions: dict[str, str] = Field(default_factory=dict)
    lifecycle: dict[str, Any] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> CreateSandboxRequest:
        # As on the reference, a 422: the body names an image or a snapshot, not both/neither.
        # (A template create, sandlot's own, names neither.)
        has_image = self.image is not None and bool(self.image.uri.strip())
        has_snapshot = bool((self.snapshot_id or "").strip())
        pooled = bool((self.extensions or {}).get("poolRef", "").strip())
        if self.template_id is None and not pooled and has_image == has_snapshot:
            raise ValueError("Exactly one of image or snapshotId must be provided.")
        if not has_snapshot:
            self.snapshot_id = None
        return self

    @field_validator("resource_limits", "env", "metadata", "extensions", mode="before")
    @classmethod
    def _null_is_empty(cls, value: Any) -> Any:
        # The reference accepts ``null`` for each of these maps (and means "none").
        return {} if value is None else value

    @field_validator("env", mode="before")
    @classmethod
    def _drop_null_env(cls, value: Any) -> Any:
        # ``{"NAME": null}`` is accepted and sets nothing, as on the reference.
        if isinstance(value, dict):
            return {k: v for k, v in value.items() if v is not None}
        return value


class RenewRequest(_Body):
    expires_at: datetime = Field(alias="expiresAt")


def rfc3339(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def status_json(rec: SandboxRecord) -> dict[str, Any]:
    status: dict[str, Any] = {
        "state": rec.state.value,
        "lastTransitionAt": rfc3339(rec.last_transition_at),
    }
    if rec.reason is not None:
        status["reason"] = rec.reason
    if rec.message is not None:
        status["message"] = rec.message
    return status


def sandbox_json(rec: SandboxRecord, *, full: bool = True) -> dict[str, Any]:
    """The ``Sandbox`` schema; ``full=False`` gives ``CreateSandboxResponse``.

    Optional fields are omitted rather than null: the released SDK parses ``expiresAt``
    and ``platform`` whenever the key is present.
    """
    body: dict[str, Any] = {
        "id": rec.id,
        "status": status_json(rec),
        "metadata": dict(rec.metadata),
        "entrypoint": list(rec.entrypoint),
        "createdAt": rfc3339(rec.created_at),
    }
    if rec.expires_at is not None:
        body["expiresAt"] = rfc3339(rec.expires_at)
    if rec.platform:
        body["platform"] = dict(rec.platform)
    if full:
        body["image"] = {"uri": rec.image_uri}
        if rec.extensions:
            body["extensions"] = dict(rec.extensions)
        body["updatedAt"] = rfc3339(rec.updated_at)
    return body
