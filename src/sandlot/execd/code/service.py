"""The code-interpreter service: contexts on kernels, and runs streamed as contract events."""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import logging
import os
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.routing import BaseRoute

from sandlot.errors import InvalidRequest, NotFound, RuntimeFailure

from .. import paths
from ..oomscore import prefer_for_oom
from .batches import Batches
from .catalog import KernelCatalog, LanguageSpec, canonical
from .context import CodeContext
from .events import Event, EventShaper, error_event, event
from .kernels.base import Kernel, KernelDied, Output, describe_exit
from .kernels.jupyter import JupyterKernel
from .kernels.node import NodeKernel
from .natives import native_kernel
from .oom import OOM_MESSAGE, OomWatch
from .pool import WarmPool
from .readiness import open_ready_port
from .settings import CodeSettings

log = logging.getLogger(__name__)

# After an interrupt (timeout or client gone), how long the kernel gets to stop before it is killed.
INTERRUPT_GRACE = 5.0


class CodeService:
    """Plugs into execd: ``routes``, ``startup()``, ``shutdown()``."""

    def __init__(self, settings: CodeSettings | None = None):
        self.settings = settings or CodeSettings.from_env()
        self.catalog = KernelCatalog(self.settings.kernel_dirs, os.environ.get("PATH", ""))
        self.contexts: dict[str, CodeContext] = {}
        self._defaults: dict[str, str] = {}
        self._executions: dict[str, str] = {}
        self._runs: set[asyncio.Task[None]] = set()
        self._pool = WarmPool(self._start_kernel_for)
        self._ready_server: Any = None  # the Jupyter API server (see readiness.py)
        self._warmup: asyncio.Task[None] | None = None
        self._discovered = False
        from .routes import build_routes

        self.routes: list[BaseRoute] = build_routes(self)

    @classmethod
    def from_env(cls) -> CodeService:
        return cls(CodeSettings.from_env())

    # ---- lifecycle -------------------------------------------------------------------------
    async def startup(self) -> None:
        await self._discover()
        for language in self.settings.prestart:
            lang = canonical(language)
            if lang in self.catalog.specs:
                self._pool.fill(lang)
            else:
                log.warning("not pre-starting %s: no kernel for it in this image", language)
        self._warmup = asyncio.create_task(self._open_when_warm())

    async def _discover(self) -> None:
        if not self._discovered:
            await asyncio.to_thread(self.catalog.discover, self.settings.languages)
            self._discovered = True
            log.info("code languages: %s", ", ".join(sorted(self.catalog.specs)) or "none")

    async def _open_when_warm(self) -> None:
        await self._pool.wait_ready()
        self._ready_server = await open_ready_port(self.settings.ready_port, self)

    async def shutdown(self) -> None:
        if self._warmup is not None:
            self._warmup.cancel()
            with contextlib.suppress(BaseException):
                await self._warmup
        if self._ready_server is not None:
            self._ready_server.close()
            await self._ready_server.wait_closed()
        for run in list(self._runs):
            run.cancel()
        await asyncio.gather(*self._runs, return_exceptions=True)
        contexts, self.contexts = list(self.contexts.values()), {}
        self._defaults.clear()
        await asyncio.gather(*(self._stop(c) for c in contexts), return_exceptions=True)
        await self._pool.close()

    # ---- kernels ---------------------------------------------------------------------------
    def available(self) -> list[str]:
        return sorted(self.catalog.specs)

    def _spec(self, language: str) -> LanguageSpec:
        spec = self.catalog.specs.get(canonical(language))
        if spec is None:
            offered = ", ".join(self.available()) or "none"
            raise InvalidRequest(
                f"language {language!r} is not supported in this sandbox; available: {offered}",
                code="UNSUPPORTED_LANGUAGE",
            )
        return spec

    def kernel_env(self) -> dict[str, str]:
        """execd's environment minus variables whose names match the strip patterns."""
        patterns = [p.upper() for p in self.settings.strip_env]
        env = {
            k: v for k, v in os.environ.items()
            if not any(fnmatch.fnmatchcase(k.upper(), p) for p in patterns)
            and not k.startswith("SANDLOT_CODE_") and k != "SANDLOT_EXECD_TOKEN"
        }
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _new_kernel(self, language: str, cwd: str | None) -> Kernel:
        spec = self._spec(language)
        workdir = cwd or self.settings.default_cwd or None
        if spec.kind == "node":
            return NodeKernel(spec.target, spec.language, cwd=workdir, env=self.kernel_env())
        if spec.kind in ("java", "go"):
            return native_kernel(spec, workdir, self.kernel_env())
        return JupyterKernel(
            self.catalog.ksm, spec.target, spec.language, cwd=workdir, env=self.kernel_env()
        )

    async def _start_kernel_for(self, language: str, cwd: str | None = None) -> Kernel:
        kernel = self._new_kernel(language, cwd)
        try:
            await kernel.start(self.settings.start_timeout)
        except KernelDied as exc:
            raise RuntimeFailure(f"{language} kernel failed to start ({exc})") from exc
        except TimeoutError as exc:
            raise RuntimeFailure(f"{language} kernel did not start in time") from exc
        prefer_for_oom(kernel.pid)
        return kernel

    async def take_warm_kernel(self, language: str) -> Kernel | None:
        """A pre-started kernel for ``language`` if one is ready (the Jupyter API shares them)."""
        return await self._pool.take(language)

    async def _acquire_kernel(self, language: str, cwd: str | None) -> Kernel:
        if cwd is None or cwd == (self.settings.default_cwd or None):
            kernel = await self._pool.take(language)
            if kernel is not None:
                return kernel
        return await self._start_kernel_for(language, cwd)

    async def _stop(self, ctx: CodeContext) -> None:
        kernel, ctx.kernel = ctx.kernel, None
        if kernel is not None:
            await kernel.shutdown()

    # ---- contexts --------------------------------------------------------------------------
    async def create_context(self, language: str, cwd: str | None = None) -> CodeContext:
        await self._discover()
        spec = self._spec(language)
        if cwd is not None:
            cwd = paths.expand(cwd)  # ~ and $VAR, as the reference
        if cwd is not None and not os.path.isdir(cwd):
            raise InvalidRequest(f"cwd {cwd!r} is not a directory", code="INVALID_CWD")
        kernel = await self._acquire_kernel(spec.language, cwd)
        ctx = CodeContext(id=uuid.uuid4().hex, language=spec.language, cwd=cwd, kernel=kernel)
        self.contexts[ctx.id] = ctx
        return ctx

    def get_context(self, context_id: str) -> CodeContext:
        ctx = self.contexts.get(context_id)
        if ctx is None:
            raise NotFound(f"code context {context_id!r} not found", code="CONTEXT_NOT_FOUND")
        return ctx

    def list_contexts(self, language: str | None) -> list[CodeContext]:
        if language is None:
            return list(self.contexts.values())
        lang = self._spec(language).language
        return [c for c in self.contexts.values() if c.language == lang]

    async def delete_context(self, context_id: str) -> None:
        ctx = self.get_context(context_id)
        self.contexts.pop(context_id, None)
        if self._defaults.get(ctx.language) == context_id:
            del self._defaults[ctx.language]
        await self._stop(ctx)

    async def delete_language(self, language: str) -> int:
        doomed = self.list_contexts(language)
        for ctx in doomed:
            await self.delete_context(ctx.id)
        return len(doomed)

    async def default_context(self, language: str) -> CodeContext:
        lang = self._spec(language).language
        ctx_id = self._defaults.get(lang)
        if ctx_id is not None and ctx_id in self.contexts:
            return self.contexts[ctx_id]
        ctx = await self.create_context(lang)
        self._defaults[lang] = ctx.id
        return ctx

    async def interrupt(self, target: str) -> None:
        """Interrupt by execution id (what the SDK sends) or by context id."""
        ctx_id = self._executions.get(target, target)
        ctx = self.contexts.get(ctx_id)
        if ctx is None:  # the reference's answer (500) for an id it does not know
            raise RuntimeFailure("error interruptting code context. no such session")
        if ctx.running is not None and ctx.kernel is not None:
            await ctx.kernel.interrupt()

    # ---- runs ------------------------------------------------------------------------------
    async def run(
        self, ctx: CodeContext, code: str, timeout: float | None = None,
        keepalive: float | None = None,
    ) -> AsyncIterator[list[Event]]:
        """Yield the run's events as the kernel produces them, those ready together in one
        batch (one write to the client instead of one each); with ``keepalive``, an empty
        batch after that many seconds without one. Closing the iterator interrupts."""
        limit = self.settings.exec_timeout
        if timeout is not None and timeout > 0:
            limit = min(limit, timeout) if limit > 0 else timeout
        batches: Batches[Event] = Batches()
        # As the reference: init, carrying the context id, comes first. Put here rather than
        # in the task, so the response's head and this event leave in one write.
        batches.put(event("init", text=ctx.id))
        # Held until the kernel has the code (released in _run_in_kernel, or by the end).
        batches.hold()
        exec_id = uuid.uuid4().hex
        task = asyncio.create_task(
            self._execute(ctx, code, exec_id, limit, batches.put, batches.release))
        self._runs.add(task)
        task.add_done_callback(self._runs.discard)
        try:
            async for batch in batches.batches(keepalive):
                yield batch
        finally:
            if not task.done():
                # The client went away mid-run: stop the cell so the context is usable again.
                # Not awaited directly: the request's own cancellation would cancel the task's
                # interrupt-and-wait clean-up too; it finishes in the background.
                task.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.wait({task})

    async def _execute(
        self, ctx: CodeContext, code: str, exec_id: str, limit: float, put: Put,
        release: Callable[[], None],
    ) -> None:
        shaper = EventShaper(self.settings.max_output_bytes, self.settings.max_result_bytes)
        try:
            # As the reference: a context already running code refuses the run (error
            # event after init) instead of queueing it.
            if ctx.lock.locked():
                put(error_event("ContextBusy", "session is busy",
                                [f"context {ctx.id} is running other code"]))
                return
            async with ctx.lock:
                self._executions[exec_id] = ctx.id
                ctx.running = exec_id
                started = time.monotonic()
                try:
                    ended = await self._run_in_kernel(ctx, code, limit, shaper, put, release)
                finally:
                    ctx.running = None
                    self._executions.pop(exec_id, None)
                if ended:
                    elapsed = int((time.monotonic() - started) * 1000)
                    put(event("execution_complete", execution_time=elapsed))
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.exception("code run failed")
            put(error_event(type(exc).__name__, f"execution failed: {exc}"))
        finally:
            put(None)

    async def _run_in_kernel(
        self, ctx: CodeContext, code: str, limit: float, shaper: EventShaper, put: Put,
        release: Callable[[], None],
    ) -> bool:
        """Run ``code``; False when it was cut short (timeout: the stream then ends with the
        error alone, as the reference's cancelled runs do), else True. ``release`` lets the
        held ``init`` out: once the kernel has been asked, or before waiting for a kernel."""
        if ctx.kernel is not None and not await ctx.kernel.is_alive():
            await self._stop(ctx)
        if ctx.kernel is None:
            release()
            ctx.kernel = await self._acquire_kernel(ctx.language, ctx.cwd)
        kernel = ctx.kernel
        watch = OomWatch(kernel.pid)
        timed_out = False

        def emit(out: Output) -> None:
            if timed_out and out.kind == "error":
                return  # reported below as a timeout, not as the kernel's KeyboardInterrupt
            for ev in shaper.shape(out):
                put(ev)

        run = asyncio.create_task(kernel.execute(code, emit))
        # After the run's first step (the ready queue is first in, first out): a kernel
        # sends the code in it, before its first wait.
        asyncio.get_running_loop().call_soon(release)
        try:
            # ``wait`` rather than ``wait_for(shield(run))``: it leaves the run alone on a
            # timeout or a cancellation just the same, with two fewer loop passes between
            # the kernel's idle and the completion event.
            finished, _ = await asyncio.wait({run}, timeout=limit if limit > 0 else None)
            if finished:
                run.result()  # KernelDied (or any other failure) is raised here
            else:
                timed_out = True
                restarted = await self._interrupt_or_kill(ctx, kernel, run)
                note = " and the kernel was restarted (state lost)" if restarted else ""
                message = f"execution exceeded its {limit:g} s limit and was interrupted{note}"
                put(error_event("TimeoutError", message))
                return False
        except asyncio.CancelledError:
            await self._interrupt_or_kill(ctx, kernel, run)
            raise
        except KernelDied as died:
            await self._stop(ctx)
            if watch.was_oom(died.killed):
                put(error_event("OutOfMemoryError", OOM_MESSAGE))
            else:
                put(error_event(
                    "KernelDied",
                    f"the {ctx.language} kernel exited ({describe_exit(died.returncode)}); the "
                    "next run starts in a fresh kernel, so earlier state is gone",
                ))
        return True

    async def _interrupt_or_kill(
        self, ctx: CodeContext, kernel: Kernel, run: asyncio.Task[None]
    ) -> bool:
        """Interrupt the cell; kill the kernel if it does not stop. True when it was killed."""
        with contextlib.suppress(Exception):
            await kernel.interrupt()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(asyncio.shield(run), INTERRUPT_GRACE)
        if run.done():
            return False
        run.cancel()
        with contextlib.suppress(BaseException):
            await run
        await self._stop(ctx)
        return True


Put = Callable[[Event | None], None]
