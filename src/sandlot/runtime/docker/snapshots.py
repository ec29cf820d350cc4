"""Snapshots on the Docker backend: a commit of the sandbox's container as an engine image.

``docker commit`` (paused for the copy, as the reference server does) stores the container's
filesystem changes as one new layer over its image's layers, which stay shared. The image is
``sandlot-snapshots:<snapshot id>``; a create with ``snapshotId`` starts from it, and the engine
refuses to remove it while a container uses it (409 ``SNAPSHOT::DELETE_CONFLICT``). Bind mounts (the
execd bundle, volumes) and the ``/run/sandlot`` tmpfs are not part of a commit.

The engine takes a committed image's settings from the container, and fills what the commit
request leaves out from it too. So the request names them all, from the container's image:
its entrypoint, command, user and working directory; the container's environment without
execd's private variables (those are set empty, so the engine cannot add them back); and
sandlot's labels set empty (a container of the snapshot gets its own from its create).
"""

from __future__ import annotations

from typing import Any

from docker.errors import APIError, DockerException
from docker.errors import ImageNotFound as DockerImageNotFound

from sandlot.errors import Conflict, RuntimeFailure
from sandlot.runtime.docker.engine import Engine

REPOSITORY = "sandlot-snapshots"
LABEL_PREFIX = "io.sandlot."
LABEL_SNAPSHOT = "io.sandlot.snapshot-id"
PRIVATE_ENV_LIST = "SANDLOT_EXECD_PRIVATE_ENV"
TOKEN_ENV = "SANDLOT_EXECD_TOKEN"


def image_ref(snapshot_id: str) -> str:
    return f"{REPOSITORY}:{snapshot_id}"


def commit_config(container: dict[str, Any], image: dict[str, Any],
                  snapshot_id: str) -> dict[str, Any]:
    """The commit request's config for ``container`` (its inspect) over ``image`` (its image's)."""
    cconf = container.get("Config") or {}
    iconf = image.get("Config") or {}
    env = [str(e) for e in cconf.get("Env") or []]
    listed = next((e.split("=", 1)[1] for e in env if e.startswith(PRIVATE_ENV_LIST + "=")), "")
    private = {PRIVATE_ENV_LIST, TOKEN_ENV, *(k for k in listed.split(",") if k)}
    kept = [e for e in env if e.split("=", 1)[0] not in private]
    labels = {k: ("" if k.startswith(LABEL_PREFIX) else v)
              for k, v in (cconf.get("Labels") or {}).items()}
    labels.update({k: v for k, v in (iconf.get("Labels") or {}).items()
                   if not k.startswith(LABEL_PREFIX)})
    labels[LABEL_SNAPSHOT] = snapshot_id
    return {
        "Env": kept + [f"{k}=" for k in sorted(private)],
        "Labels": labels,
        "User": iconf.get("User") or "0:0",
        "WorkingDir": iconf.get("WorkingDir") or "",
        # empty rather than missing: the engine would fill a missing one with execd's argv
        "Entrypoint": iconf.get("Entrypoint") or [],
        "Cmd": iconf.get("Cmd"),
    }


async def commit(engine: Engine, container: dict[str, Any], snapshot_id: str) -> None:
    """Commit ``container`` (its inspect) as snapshot ``snapshot_id``'s image."""
    try:
        image = await engine.call(engine.api.inspect_image, container["Image"])
        await engine.call(engine.api.commit, container["Id"], repository=REPOSITORY,
                          tag=snapshot_id, pause=True,
                          conf=commit_config(container, image, snapshot_id))
    except DockerException as exc:
        raise RuntimeFailure(f"the Docker engine cannot commit snapshot {snapshot_id}: "
                             f"{getattr(exc, 'explanation', None) or exc}") from exc


async def remove(engine: Engine, snapshot_id: str) -> None:
    """Remove the snapshot's image (idempotent); ``Conflict`` while a container uses it."""
    try:
        await engine.call(engine.api.remove_image, image_ref(snapshot_id))
    except DockerImageNotFound:
        return
    except APIError as exc:
        if exc.status_code == 409:
            raise Conflict(f"snapshot {snapshot_id} is in use (the Docker engine keeps its "
                           "image while a sandbox, or a later snapshot or template, stands on "
                           "it): delete those first",
                           code="SNAPSHOT::DELETE_CONFLICT") from exc
        raise RuntimeFailure(f"cannot remove snapshot {snapshot_id}'s image: "
                             f"{exc.explanation or exc}") from exc
