"""The compat suite's representative subset on gVisor (oci runtime with runsc).

The released ``opensandbox`` SDK's lifecycle, commands/files and code-interpreter
quickstart, run unchanged against a server configured with ``[secure_runtime] type =
"gvisor"``; plus what only gVisor shows (its kernel inside) and its start-up report.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from opensandbox import Sandbox

from tests.compat.conftest import COMPAT_IMAGE, SandlotServer
from tests.compat.test_code_interpreter import (  # noqa: F401 - fixtures used by name
    check_hello,
    check_state,
    closing,
    code_interpreter_image,
    code_server,
    interpreter_for,
    new_sandbox,
)
from tests.compat.test_quickstart import test_quickstart_prints_hello_world  # noqa: F401
from tests.compat.test_sdk_lifecycle import (  # noqa: F401
    test_sdk_commands_and_files,
    test_sdk_lifecycle,
)

pytestmark = [pytest.mark.backends("runsc"), pytest.mark.timeout(2400)]


async def test_code_interpreter_quickstart(
    code_server: SandlotServer,  # noqa: F811 - the imported fixture, by name
    record_property: Any,
) -> None:
    """The code-interpreter quickstart (Python context: hello, state kept between runs)."""
    sandbox = await new_sandbox(code_server)
    ci = None
    try:
        ci = await interpreter_for(sandbox)
        await check_hello(ci, record_property)
        await check_state(ci)
    finally:
        await closing(sandbox, ci)


async def test_gvisor_kernel_inside(sandlot_server: SandlotServer) -> None:
    sandbox = await Sandbox.create(
        COMPAT_IMAGE, connection_config=sandlot_server.sdk_config(),
        timeout=timedelta(minutes=5), ready_timeout=timedelta(seconds=60),
    )
    try:
        run = await sandbox.commands.run("uname -r; dmesg | head -n 3; ls /host 2>&1 | head -1")
        out = "\n".join(m.text.rstrip("\n") for m in run.logs.stdout)
        assert run.exit_code == 0, run
        assert out.splitlines()[0] == "4.4.0"  # gVisor's kernel version, not the host's
        assert "gVisor" in out  # dmesg is gVisor's own boot log
    finally:
        await sandbox.kill()
        await sandbox.close()
    assert "isolation: gvisor" in sandlot_server.log_tail(20000)
