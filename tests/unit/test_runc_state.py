"""``Runc.state``: a failed query of a container that still has state is not "gone"."""

from __future__ import annotations

from pathlib import Path

import pytest

from sandlot.runtime.oci import runc as runc_mod
from sandlot.runtime.oci.runc import Runc, RuncError


def _binary(tmp_path: Path, fail_first: int) -> Path:
    """A stand-in runtime binary whose ``state`` fails its first ``fail_first`` calls."""
    calls = tmp_path / "calls"
    calls.write_text("")
    script = tmp_path / "fake-runc"
    script.write_text(
        "#!/bin/sh\n"
        f'echo x >> "{calls}"\n'
        f'if [ "$(wc -l < "{calls}")" -le {fail_first} ]; then\n'
        '  echo "cannot talk to the sandbox" >&2; exit 1\n'
        "fi\n"
        'echo \'{"id": "c1", "status": "running", "pid": 42}\'\n')
    script.chmod(0o755)
    return script


def _calls(tmp_path: Path) -> int:
    return len((tmp_path / "calls").read_text().splitlines())


@pytest.fixture(autouse=True)
def _no_pause(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runc_mod, "STATE_RETRY_PAUSE", 0.0)


async def test_a_transient_failure_is_asked_again(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "c1").mkdir(parents=True)
    rc = Runc(str(_binary(tmp_path, fail_first=1)), root)
    assert (await rc.state("c1")) == {"id": "c1", "status": "running", "pid": 42}
    assert _calls(tmp_path) == 2


async def test_a_lasting_failure_is_raised_not_reported_gone(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "c1").mkdir(parents=True)
    rc = Runc(str(_binary(tmp_path, fail_first=100)), root)
    with pytest.raises(RuncError, match="cannot talk to the sandbox"):
        await rc.state("c1")
    assert _calls(tmp_path) == runc_mod.STATE_TRIES


async def test_no_state_is_gone_without_asking(tmp_path: Path) -> None:
    rc = Runc(str(_binary(tmp_path, fail_first=0)), tmp_path / "root")
    assert (await rc.state("c1")) is None
    assert _calls(tmp_path) == 0
