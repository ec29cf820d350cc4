"""Registry transport through skopeo: inspect a reference, copy an image into an OCI layout.

skopeo (a well-kept Debian package) speaks the registry protocol, auth and TLS for us; we only
build its command lines and translate its failures into ImageNotFound / ImagePullError.
Credentials go in a 0600 auth file, never on a command line others can read in /proc.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from sandlot.errors import ImageNotFound, ImagePullError
from sandlot.images.model import RegistryAuth
from sandlot.images.reference import Reference

_NOT_FOUND_MARKERS = (
    "manifest unknown",
    "name unknown",
    "not found",
    "repository name not known",
    "does not exist",
    "no such image",
)
_AUTH_MARKERS = ("unauthorized", "authentication required", "access denied", "denied:")
# We do not verify signatures; the policy file says so explicitly instead of relying on the
# host's /etc/containers/policy.json (absent on some hosts, restrictive on others).
_POLICY = {"default": [{"type": "insecureAcceptAnything"}]}


def skopeo_binary() -> str:
    path = shutil.which("skopeo")
    if path is None:
        raise ImagePullError("skopeo is not installed (apt-get install skopeo)")
    return path


class Skopeo:
    """skopeo invocations sharing one policy file and (optionally) one auth file."""

    def __init__(self, workdir: Path, *, auth: RegistryAuth | None, registry: str | None):
        self.workdir = workdir
        self.policy = workdir / "policy.json"
        self.policy.write_text(json.dumps(_POLICY))
        self.authfile: Path | None = None
        if auth is not None and registry is not None:
            self.authfile = workdir / "auth.json"
            token = base64.b64encode(f"{auth.username}:{auth.password}".encode()).decode()
            fd = os.open(self.authfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as fh:
                json.dump({"auths": {registry: {"auth": token}}}, fh)

    def _base(self) -> list[str]:
        return [skopeo_binary(), "--policy", str(self.policy)]

    def _auth_args(self) -> list[str]:
        # Without explicit credentials, use none at all rather than whatever the host user
        # logged in with: the API caller decides which credentials a pull uses.
        if self.authfile is not None:
            return ["--authfile", str(self.authfile)]
        return ["--no-creds"]

    async def _run(self, args: list[str], what: str) -> bytes:
        try:
            proc = await asyncio.create_subprocess_exec(
                *args,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
            )
        except OSError as exc:
            raise ImagePullError(f"cannot run skopeo: {exc}") from exc
        try:
            out, err = await proc.communicate()
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise
        if proc.returncode != 0:
            raise classify_failure(what, err.decode(errors="replace"))
        return out

    async def inspect_raw(self, ref: Reference, *, tls_verify: bool) -> bytes:
        """The manifest (or manifest list) bytes exactly as the registry serves them."""
        args = [*self._base(), "inspect", "--raw", f"--tls-verify={str(tls_verify).lower()}"]
        args += [*self._auth_args(), f"docker://{ref.transport_ref}"]
        return await self._run(args, f"image {ref.canonical}")

    async def copy_to_layout(
        self,
        source: str,
        layout: Path,
        *,
        tls_verify: bool = True,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        """Copy ``source`` (any skopeo transport) into ``oci:layout:img``.

        ``progress`` is called with the bytes on disk in the layout so far (polled), which
        is how we get a byte-level progress bar out of a tool that has no machine output.
        """
        args = [*self._base(), "copy", "--quiet"]
        if source.startswith("docker://"):
            args += [f"--src-tls-verify={str(tls_verify).lower()}"]
            if self.authfile is not None:
                args += ["--src-authfile", str(self.authfile)]
            else:
                args += ["--src-no-creds"]
        args += [source, f"oci:{layout}:img"]
        task = asyncio.ensure_future(self._run(args, source.removeprefix("docker://")))
        try:
            while not task.done():
                if progress is not None:
                    progress(_bytes_in(layout))
                await asyncio.wait({task}, timeout=0.25)
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, ImagePullError):
                    await task
        task.result()


def _bytes_in(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            with contextlib.suppress(OSError):
                total += os.lstat(os.path.join(dirpath, name)).st_size
    return total


def classify_failure(what: str, stderr: str) -> Exception:
    """Map skopeo's error text to ImageNotFound (no such repo/tag) or ImagePullError."""
    lines = [ln.strip() for ln in stderr.strip().splitlines() if ln.strip()]
    detail = lines[-1] if lines else "skopeo failed"
    detail = detail.removeprefix('time="').split('msg="', 1)[-1].rstrip('"')
    low = stderr.lower()
    if any(m in low for m in _AUTH_MARKERS):
        return ImagePullError(f"{what}: registry refused access (check credentials): {detail}")
    if any(m in low for m in _NOT_FOUND_MARKERS):
        return ImageNotFound(f"{what} not found: {detail}")
    return ImagePullError(f"pulling {what} failed: {detail}")
