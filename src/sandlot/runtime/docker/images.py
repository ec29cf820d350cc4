"""Images come from the engine: used when present, pulled (with the request's credentials)
when not, and refused with the engine's own reason when it cannot get them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from docker.errors import APIError, DockerException
from docker.errors import ImageNotFound as DockerImageNotFound

from sandlot.errors import ImageNotFound, ImagePullError, InvalidRequest
from sandlot.runtime.base import ImageRef, Progress
from sandlot.runtime.docker.engine import Engine

# How the engine words "there is no such image" (registry answers differ in wording).
_NOT_FOUND_HINTS = ("not found", "manifest unknown", "pull access denied", "does not exist",
                    "repository does not exist", "no such image")


@dataclass(frozen=True)
class EngineImage:
    """What a container start needs to know of an image the engine holds."""

    id: str
    working_dir: str | None
    os: str
    arch: str
    env: tuple[str, ...] = ()  # "KEY=value", as the engine adds them to every container

    @classmethod
    def of(cls, attrs: dict[str, Any]) -> EngineImage:
        config = attrs.get("Config") or {}
        return cls(id=str(attrs["Id"]), working_dir=config.get("WorkingDir") or None,
                   os=str(attrs.get("Os") or "linux"),
                   arch=str(attrs.get("Architecture") or ""),
                   env=tuple(config.get("Env") or ()))


def _auth_config(ref: ImageRef) -> dict[str, str] | None:
    if ref.auth is None:
        return None
    return {"username": ref.auth.username, "password": ref.auth.password}


def _split(reference: str) -> tuple[str, str | None]:
    """``repo[:tag]`` or ``repo@digest`` into the repository and tag/digest pull() wants."""
    if "@" in reference:
        repo, _, digest = reference.partition("@")
        return repo, digest
    last = reference.rsplit("/", 1)[-1]
    if ":" in last:
        repo, _, tag = reference.rpartition(":")
        return repo, tag
    return reference, "latest"


def _check_platform(ref: ImageRef, image: EngineImage) -> None:
    if ref.platform is None:
        return
    want_os, _, want_arch = ref.platform.partition("/")
    if (want_os, want_arch) != (image.os, image.arch):
        raise InvalidRequest(
            f"image {ref.reference} is {image.os}/{image.arch}, not the requested {ref.platform}"
        )


async def lookup(engine: Engine, reference: str) -> EngineImage | None:
    """The engine's image ``reference`` if it has it (never pulls)."""
    try:
        return EngineImage.of(await engine.call(engine.api.inspect_image, reference))
    except DockerImageNotFound:
        return None


async def resolve(engine: Engine, ref: ImageRef, progress: Progress | None) -> EngineImage:
    """The engine's image for ``ref``, pulled first when the engine does not have it."""
    try:
        attrs = await engine.call(engine.api.inspect_image, ref.reference)
    except DockerImageNotFound:
        attrs = None
    except DockerException as exc:
        raise ImagePullError(f"cannot inspect image {ref.reference}: {exc}") from exc
    if attrs is None:
        if progress is not None:
            await progress("Pulling", f"pulling image {ref.reference}")
        attrs = await _pull(engine, ref)
    image = EngineImage.of(attrs)
    _check_platform(ref, image)
    return image


async def _pull(engine: Engine, ref: ImageRef) -> dict[str, Any]:
    repo, tag = _split(ref.reference)
    try:
        await engine.call(engine.api.pull, repo, tag=tag, auth_config=_auth_config(ref),
                          platform=ref.platform)
        return await engine.call(engine.api.inspect_image, ref.reference)
    except (APIError, DockerImageNotFound) as exc:
        text = str(getattr(exc, "explanation", None) or exc)
        if isinstance(exc, DockerImageNotFound) or any(h in text.lower() for h in _NOT_FOUND_HINTS):
            raise ImageNotFound(
                f"image {ref.reference} is not in the Docker engine and the engine cannot pull "
                f"it: {text}"
            ) from exc
        raise ImagePullError(f"the Docker engine failed to pull {ref.reference}: {text}") from exc
    except DockerException as exc:
        raise ImagePullError(f"the Docker engine failed to pull {ref.reference}: {exc}") from exc
