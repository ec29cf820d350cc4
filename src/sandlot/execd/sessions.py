"""Bash sessions (``/session``), as the reference execd runs them (``bash_session.go``):
each run is a fresh ``bash --noprofile --norc`` on a script file, started with the session's
saved exported environment, that ``cd``s to the session's saved directory (or the run's
``cwd``). After the command the script saves its exported variables and working directory
for the next run. So ``cd``/``export`` persist, ``exit N`` ends only that run, a run's ``cwd``
persists, and runs may overlap. stderr is merged into stdout; the init event carries the
session id; output is framed as the reference frames session output (``lines``).

Differences (sandlot's, see docs/compatibility-execd.md): the state is saved to files rather
than parsed out of stdout; the saved environment is the whole start environment (a variable
``unset`` in a run stays unset); a run's timeout kills its process group and ends the
stream with an ``error`` event.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import shutil
import uuid

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from sandlot.errors import NotFound, RuntimeFailure
from sandlot.execd import paths, procs, sse
from sandlot.execd.commands import CommandService, find_shell, make_pipe
from sandlot.execd.execution import Execution
from sandlot.execd.http import JSON, bad_request, expect_object, json_body, ok
from sandlot.execd.settings import Settings

# Not carried from one run to the next (prompt and display variables), as the reference.
NOT_PERSISTED = frozenset({"PS1", "PS2", "PS3", "PS4", "PROMPT_COMMAND", "_", "SHLVL"})
MAX_PERSISTED_VALUE = 8 * 1024


def _valid_name(name: str) -> bool:
    return name.isidentifier() and name.isascii()


def parse_env_dump(data: bytes) -> dict[str, str]:
    """``NAME=value\\0`` records (what the wrapper writes) as a dict, filtered as the reference
    filters what it persists."""
    env: dict[str, str] = {}
    for record in data.split(b"\0"):
        name, sep, value = record.decode(errors="surrogateescape").partition("=")
        if not sep or not _valid_name(name) or name in NOT_PERSISTED:
            continue
        if len(value) > MAX_PERSISTED_VALUE:
            continue
        env[name] = value
    return env


class BashSession:
    """A session's saved state and its running runs."""

    def __init__(self, service: SessionService, session_id: str, cwd: str) -> None:
        self.service = service
        self.id = session_id
        self.cwd = cwd
        self.env = service.commands.base_env()
        self.dir = os.path.join(service.commands.state_dir, f"session-{session_id}")
        os.makedirs(self.dir, mode=0o700, exist_ok=True)
        self.running: set[str] = set()
        self.closed = False

    def run(self, command: str, cwd: str | None, timeout_ms: int | None) -> Execution:
        commands = self.service.commands
        ex = commands.new_execution(command, background=False, session_lines=True,
                                    init_id=self.id)
        state = os.path.join(self.dir, ex.id)
        script = state + ".sh"
        with open(script, "w", encoding="utf-8", errors="surrogateescape") as fh:
            fh.write(self._script(command, cwd or self.cwd, state))
        out_r, out_w = make_pipe()
        shell = find_shell()
        argv = [shell, "--noprofile", "--norc", script] if shell.endswith("bash") else [shell,
                                                                                       script]
        try:
            pid, exited = procs.spawn(argv, cwd=self._start_dir(), env=self.env,
                                      stdout=out_w, stderr=out_w)
        except OSError as exc:
            os.close(out_r)
            ex.finish(127, error=f"start bash: {exc.strerror or exc}")
            ex.log.seal()
            return ex
        finally:
            os.close(out_w)
        self.running.add(ex.id)
        commands.watch(ex, pid, exited, out_r, None,
                       on_finished=lambda done: self._finished(done, state))
        if timeout_ms:
            handle = asyncio.get_running_loop().call_later(
                timeout_ms / 1000, self._on_timeout, ex
            )
            ex.done.add_done_callback(lambda _f: handle.cancel())
        return ex

    def _start_dir(self) -> str:
        workdir = self.service.settings.workdir
        return workdir if os.path.isdir(workdir) else "/"

    @staticmethod
    def _script(command: str, cwd: str, state: str) -> str:
        env_file, pwd_file = shlex.quote(state + ".env"), shlex.quote(state + ".pwd")
        lines = []
        if cwd:
            lines.append(f"cd {shlex.quote(cwd)}")
        lines.append(command if command.endswith("\n") else command + "\n")
        lines.append(
            "__sandlot_ec=$?\n"
            f"for __sandlot_v in $(compgen -e); do printf '%s=%s\\0' \"$__sandlot_v\" "
            f"\"${{!__sandlot_v}}\"; done > {env_file}\n"
            f"pwd > {pwd_file}\n"
            'exit "$__sandlot_ec"\n'
        )
        return "\n".join(lines)

    def _finished(self, ex: Execution, state: str) -> None:
        self.running.discard(ex.id)
        pwd = ""
        with contextlib.suppress(OSError):
            with open(state + ".pwd", encoding="utf-8", errors="surrogateescape") as fh:
                pwd = fh.read().rstrip("\n")
        # The working directory is written after the exports: without it (``exit``, a kill
        # during the dump) the run saved nothing complete, and the session keeps its state.
        if pwd and not self.closed:
            with contextlib.suppress(OSError):
                with open(state + ".env", "rb") as fh:
                    env = parse_env_dump(fh.read())
                if env:
                    self.env = env
            self.cwd = pwd
        for suffix in (".sh", ".env", ".pwd"):
            with contextlib.suppress(OSError):
                os.unlink(state + suffix)

    def _on_timeout(self, ex: Execution) -> None:
        if ex.running:
            ex.timed_out = True
            self.service.commands.kill_running(ex.id)

    def close(self) -> None:
        """Kill every running run (SIGKILL, as the reference) and forget the state."""
        self.closed = True
        for exec_id in list(self.running):
            self.service.commands.kill_running(exec_id)
        shutil.rmtree(self.dir, ignore_errors=True)


class SessionService:
    def __init__(self, settings: Settings, commands: CommandService) -> None:
        self.settings = settings
        self.commands = commands
        self.sessions: dict[str, BashSession] = {}
        commands.interrupt_other = self._interrupt

    async def startup(self) -> None:
        return None

    async def shutdown(self) -> None:
        for s in list(self.sessions.values()):
            s.close()
        self.sessions.clear()

    def routes(self) -> list[BaseRoute]:
        return [
            Route("/session", self.create_route, methods=["POST"]),
            Route("/session/{sid}/run", self.run_route, methods=["POST"]),
            Route("/session/{sid}", self.delete_route, methods=["DELETE"]),
        ]

    async def create_route(self, request: Request) -> Response:
        body = await json_body(request, required=False)
        data = expect_object(body) if body is not None else {}
        cwd = data.get("cwd") or ""
        if not isinstance(cwd, str):
            raise bad_request("'cwd' must be a string")
        if cwd:
            cwd = paths.expand(cwd)
            try:  # the reference creates a missing directory
                os.makedirs(cwd, exist_ok=True)
            except OSError as exc:
                raise RuntimeFailure(f"error creating session. {exc}") from None
        sid = str(uuid.uuid4())
        self.sessions[sid] = BashSession(self, sid, cwd)
        return JSON({"session_id": sid})

    async def run_route(self, request: Request) -> Response:
        sid = request.path_params["sid"]
        data = expect_object(await json_body(request))
        command = data.get("command")
        if not isinstance(command, str) or not command:
            raise bad_request("invalid request. 'command' (non-empty string) is required")
        cwd = data.get("cwd") or None
        if cwd is not None:
            if not isinstance(cwd, str):
                raise bad_request("'cwd' must be a string")
            cwd = paths.expand(cwd)
            if not os.path.isdir(cwd):
                raise bad_request(f"invalid request. working directory does not exist: {cwd}")
        timeout = data.get("timeout")
        if timeout is not None and (
            not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 0
        ):
            raise bad_request("'timeout' must be a non-negative integer (milliseconds)")
        session = self.sessions.get(sid)
        if session is None:  # the reference answers 500 here (context not found)
            raise RuntimeFailure("error running in session. context not found")
        ex = session.run(command, cwd, timeout or None)
        return self.commands.stream(ex, sse_frames=sse.wants_sse(request))

    async def delete_route(self, request: Request) -> Response:
        sid = request.path_params["sid"]
        session = self.sessions.pop(sid, None)
        if session is None:
            raise NotFound(f"session {sid} not found", code="CONTEXT_NOT_FOUND")
        session.close()
        return ok()

    async def _interrupt(self, target: str) -> bool:
        """``DELETE /command?id=<session id>`` closes the session, as the reference does."""
        session = self.sessions.pop(target, None)
        if session is None:
            return False
        session.close()
        return True

