"""The server's wait for a new sandbox's execd, and what a failed one leaves to read.

execd's start-up output (its stderr: an import error, a refused bind, a crash) goes to the
container's log, which goes with the sandbox's folder when the failed create is cleaned up.
So when execd never answers, or the sandbox stops before it does (execd or its zygote then
ends the container's init: the wait ends at once instead of running out its timeout), the
log's tail is written to the server's log and its last line to the sandbox's Failed reason.
"""

from __future__ import annotations

import logging
import textwrap

from sandlot.errors import RuntimeFailure
from sandlot.runtime import admission, execd_client
from sandlot.runtime.base import Runtime

log = logging.getLogger(__name__)

TAIL_BYTES = 4096  # of the container's log, into the server's log
REASON_CHARS = 300  # of its last line, into the sandbox's reason
ENDED_CHECK_EVERY = 1.0


async def wait_for_execd(runtime: Runtime, sandbox_id: str, port: int, token: str | None,
                         timeout: float) -> None:
    """Return once the sandbox's execd answers; else raise RuntimeFailure saying why."""
    try:
        await execd_client.wait_ready(
            lambda: runtime.connect(sandbox_id, port), token, timeout,
            ended=admission.container_ended(runtime.inspect, sandbox_id),
            check_every=ENDED_CHECK_EVERY)
    except (execd_client.ExecdEnded, TimeoutError) as exc:
        tail = await _log_tail(runtime, sandbox_id)
        log.warning("execd of sandbox %s did not start: %s; the container's log ends:\n%s",
                    sandbox_id, exc, textwrap.indent(tail or "(empty)", "  | ", lambda _: True))
        last = tail.strip().splitlines()[-1][:REASON_CHARS] if tail.strip() else ""
        raise RuntimeFailure(f"execd did not answer: {exc}"
                             + (f"; its last output: {last}" if last else "")) from exc


async def _log_tail(runtime: Runtime, sandbox_id: str) -> str:
    try:
        found = await runtime.init_log(sandbox_id, TAIL_BYTES)
    except Exception:  # noqa: BLE001 - the failure is reported without it
        log.exception("cannot read the container log of %s", sandbox_id)
        return ""
    return found[0].decode(errors="replace") if found is not None else ""
