"""Unauthenticated liveness and version routes."""

from __future__ import annotations

from fastapi import APIRouter

from sandlot import __version__

router = APIRouter()


@router.get("/health")
async def health() -> dict:
    return {"status": "healthy"}


@router.get("/version")
async def version() -> dict:
    return {"version": __version__, "name": "sandlot", "apiVersion": "v1"}
