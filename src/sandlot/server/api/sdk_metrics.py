"""``POST /v1/metrics/events``: the SDK's fire-and-forget create-latency reports.

Accepted (204) and recorded in a Prometheus histogram, so the released SDK's reports land
somewhere useful instead of failing.
"""

from __future__ import annotations

import logging
from typing import Literal

from fastapi import APIRouter, Response
from prometheus_client import Histogram
from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)
router = APIRouter()

SDK_CREATE_SECONDS = Histogram(
    "sandlot_sdk_create_duration_seconds",
    "Sandbox create-to-ready time as reported by SDK clients",
    ["success"],
)


class MetricsEvent(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)
    event_type: Literal["sandbox.create"] = Field(alias="eventType")
    create_duration_ms: int = Field(alias="createDurationMs", ge=0)
    success: bool
    sandbox_id: str | None = Field(default=None, alias="sandboxId")
    image: str | None = None


@router.post("/metrics/events", status_code=204)
async def report_event(event: MetricsEvent) -> Response:
    SDK_CREATE_SECONDS.labels(success=str(event.success).lower()).observe(
        event.create_duration_ms / 1000
    )
    log.debug("sdk create event: %s", event.model_dump())
    return Response(status_code=204)
