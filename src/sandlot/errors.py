"""Typed errors shared by the planes; each maps to the contracts' ``{code, message}`` shape.

Routes never build error bodies themselves: they raise one of these and the app's exception
handler turns it into a response with ``status`` and ``{"code": code, "message": message}``.
"""

from __future__ import annotations


class SandlotError(Exception):
    status: int = 500
    code: str = "INTERNAL_ERROR"

    def __init__(self, message: str, *, code: str | None = None, status: int | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if status is not None:
            self.status = status

    def body(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


class InvalidRequest(SandlotError):
    status = 400
    code = "INVALID_REQUEST"


class Unauthorized(SandlotError):
    status = 401
    code = "UNAUTHORIZED"


class Forbidden(SandlotError):
    status = 403
    code = "FORBIDDEN"


class NotFound(SandlotError):
    status = 404
    code = "NOT_FOUND"


class Conflict(SandlotError):
    status = 409
    code = "CONFLICT"


class Unsupported(SandlotError):
    """An operation this deployment does not offer; the message says why."""

    status = 501
    code = "NOT_SUPPORTED"


class RuntimeFailure(SandlotError):
    status = 500
    code = "RUNTIME_ERROR"


class ImageNotFound(SandlotError):
    status = 404
    code = "IMAGE_NOT_FOUND"


class ImagePullError(SandlotError):
    status = 502
    code = "IMAGE_PULL_FAILED"
