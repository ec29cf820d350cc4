"""The Jupyter API's kernels: kernelspecs from the code service's catalog, starts, culling.

Kernelspec names: a Jupyter kernel keeps its spec's name (``python3``, ``bash``, ...); sandlot's
native contexts are named by language (``java``, ``go``, ``javascript``, ``typescript``); and the
optional stripped kernel (``SANDLOT_JUPYTER_STRIPPED_KERNEL``) is the Python spec with an
environment from which variables matching the secret patterns are removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
import os
import uuid
from typing import TYPE_CHECKING, Any

from jupyter_client.manager import AsyncKernelManager

from sandlot.errors import InvalidRequest, NotFound, RuntimeFailure

from ..catalog import LanguageSpec
from ..kernels.base import Kernel, KernelDied
from ..kernels.jupyter import JupyterKernel
from ..kernels.node import NodeKernel
from ..natives import native_kernel
from .kernels import ApiKernel, now
from .native_kernel import NativeApiKernel
from .settings import JupyterApiSettings
from .zmq_kernel import ZmqApiKernel

if TYPE_CHECKING:
    from ..service import CodeService

log = logging.getLogger(__name__)


class KernelRegistry:
    def __init__(self, service: CodeService, settings: JupyterApiSettings):
        self.service = service
        self.settings = settings
        self.kernels: dict[str, ApiKernel] = {}
        self._culler: asyncio.Task[None] | None = None

    # ---- kernelspecs -----------------------------------------------------------------------
    def _named(self) -> dict[str, tuple[LanguageSpec, bool]]:
        """kernelspec name -> (language spec, stripped environment?)."""
        named: dict[str, tuple[LanguageSpec, bool]] = {}
        for spec in self.service.catalog.specs.values():
            name = spec.target if spec.kind == "jupyter" else spec.language
            named[name] = (spec, False)
        python = self.service.catalog.specs.get("python")
        if self.settings.stripped_kernel and python is not None:
            named[self.settings.stripped_kernel] = (python, True)
        return named

    def default_name(self) -> str:
        named = self._named()
        if self.settings.default_kernel in named:
            return self.settings.default_kernel
        python = self.service.catalog.specs.get("python")
        if python is not None:
            return python.target
        return next(iter(sorted(named)), "")

    def kernelspecs(self) -> dict[str, Any]:
        return {
            "default": self.default_name(),
            "kernelspecs": {name: self._spec_model(name, spec, stripped)
                            for name, (spec, stripped) in sorted(self._named().items())},
        }

    def kernelspec(self, name: str) -> dict[str, Any]:
        found = self._named().get(name)
        if found is None:
            raise NotFound(f"no kernelspec {name!r}; available: {', '.join(sorted(self._named()))}",
                           code="KERNELSPEC_NOT_FOUND")
        return self._spec_model(name, *found)

    def _spec_model(self, name: str, spec: LanguageSpec, stripped: bool) -> dict[str, Any]:
        body: dict[str, Any]
        if spec.kind == "jupyter":
            resolved = self.service.catalog.ksm.get_kernel_spec(spec.target)
            body = resolved.to_dict()
        else:
            body = {"argv": [], "env": {}, "display_name": spec.display_name,
                    "language": spec.language, "interrupt_mode": "signal", "metadata": {}}
        body["metadata"] = {**body.get("metadata", {}), "sandlot": {"backend": spec.kind}}
        if stripped:
            body["display_name"] = f"{body.get('display_name', 'Python')} (secrets removed)"
            body["metadata"]["sandlot"]["stripped_env"] = list(self.settings.stripped_env)
        return {"name": name, "spec": body, "resources": {}}

    # ---- kernels ---------------------------------------------------------------------------
    def get(self, kernel_id: str) -> ApiKernel:
        kernel = self.kernels.get(kernel_id)
        if kernel is None:
            raise NotFound(f"kernel {kernel_id!r} not found", code="KERNEL_NOT_FOUND")
        return kernel

    def all(self) -> list[ApiKernel]:
        return list(self.kernels.values())

    def _env(self, stripped: bool, extra: dict[str, str]) -> dict[str, str]:
        env = self.service.kernel_env()
        if stripped:
            patterns = [p.upper() for p in self.settings.stripped_env]
            env = {k: v for k, v in env.items()
                   if not any(fnmatch.fnmatchcase(k.upper(), p) for p in patterns)}
        return {**env, **extra}

    async def start(
        self, name: str | None, env_extra: dict[str, str], cwd: str | None
    ) -> ApiKernel:
        name = name or self.default_name()
        found = self._named().get(name)
        if found is None:
            raise NotFound(f"no kernelspec {name!r}; available: {', '.join(sorted(self._named()))}",
                           code="KERNELSPEC_NOT_FOUND")
        spec, stripped = found
        if cwd is not None and not os.path.isdir(cwd):
            raise InvalidRequest(f"path {cwd!r} is not a directory", code="INVALID_PATH")
        workdir = cwd or self.service.settings.default_cwd or None
        env = self._env(stripped, env_extra)
        kernel_id = str(uuid.uuid4())
        kernel: ApiKernel
        if spec.kind == "jupyter":
            warm = None
            if not stripped and not env_extra and cwd is None:
                warm = await self.service.take_warm_kernel(spec.language)
            if isinstance(warm, JupyterKernel):
                warm.release_client()
                kernel = ZmqApiKernel(kernel_id, name, spec.language, warm.manager,
                                      cwd=workdir, env=env, started=True)
            else:
                if warm is not None:
                    await warm.shutdown()
                km = AsyncKernelManager(kernel_name=spec.target,
                                        kernel_spec_manager=self.service.catalog.ksm)
                kernel = ZmqApiKernel(kernel_id, name, spec.language, km, cwd=workdir, env=env)
        else:
            kernel = NativeApiKernel(kernel_id, name, spec.language,
                                     lambda: self._start_native(spec, workdir, env))
        try:
            await asyncio.wait_for(kernel.start(), self.service.settings.start_timeout)
        except (TimeoutError, KernelDied, RuntimeError) as exc:
            with contextlib.suppress(Exception):
                await kernel.shutdown()
            raise RuntimeFailure(f"{name} kernel failed to start ({exc or 'timed out'})") from exc
        kernel.touch()
        self.kernels[kernel_id] = kernel
        return kernel

    async def _start_native(self, spec: LanguageSpec, cwd: str | None,
                            env: dict[str, str]) -> Kernel:
        kernel: Kernel
        if spec.kind == "node":
            kernel = NodeKernel(spec.target, spec.language, cwd=cwd, env=env)
        else:
            kernel = native_kernel(spec, cwd, env)
        await kernel.start(self.service.settings.start_timeout)
        return kernel

    async def delete(self, kernel_id: str) -> None:
        kernel = self.get(kernel_id)
        self.kernels.pop(kernel_id, None)
        await kernel.shutdown()

    # ---- culling ---------------------------------------------------------------------------
    def start_culling(self) -> None:
        if self.settings.cull_idle > 0 and self._culler is None:
            self._culler = asyncio.create_task(self._cull_loop())

    async def _cull_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.cull_interval or 1.0)
            await self.cull_once()

    async def cull_once(self) -> list[str]:
        """Shut down kernels idle for longer than the limit; their ids."""
        culled: list[str] = []
        for kernel in list(self.kernels.values()):
            idle_for = (now() - kernel.last_activity).total_seconds()
            if kernel.execution_state not in ("idle", "starting") and kernel.execution_state:
                continue
            if kernel.clients and not self.settings.cull_connected:
                continue
            if idle_for > self.settings.cull_idle:
                log.info("culling kernel %s (%s), idle for %.0f s", kernel.id, kernel.name,
                         idle_for)
                with contextlib.suppress(NotFound):
                    await self.delete(kernel.id)
                culled.append(kernel.id)
        return culled

    async def close(self) -> None:
        if self._culler is not None:
            self._culler.cancel()
            with contextlib.suppress(BaseException):
                await self._culler
        kernels, self.kernels = list(self.kernels.values()), {}
        await asyncio.gather(*(k.shutdown() for k in kernels), return_exceptions=True)
