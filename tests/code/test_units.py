"""Unit tests of the pure parts: event shaping and caps, kernelspec discovery, settings, OOM."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sandlot.execd.code.catalog import KernelCatalog, canonical
from sandlot.execd.code.events import EventShaper
from sandlot.execd.code.kernels.base import KernelDied, Output
from sandlot.execd.code.kernels.exitwatch import returncode
from sandlot.execd.code.oom import OomWatch, oom_kills
from sandlot.execd.code.settings import CodeSettings


def test_result_bundle_keeps_every_mime_and_renames_text_plain_to_text():
    shaper = EventShaper(1000, 1000)
    data = {"image/png": "iVBOR", "text/plain": "<Figure>", "text/html": "<b>x</b>",
            "image/svg+xml": "<svg/>", "application/json": {"a": 1}}
    (ev,) = shaper.shape(Output("result", data=data))  # display_data: no count, no count event
    assert ev["type"] == "result" and isinstance(ev["timestamp"], int)
    assert ev["results"] == {**{k: v for k, v in data.items() if k != "text/plain"},
                             "text": "<Figure>"}  # as the reference renames it


def test_execution_count_only_just_before_an_execute_result():
    shaper = EventShaper(1000, 1000)
    assert shaper.shape(Output("count", count=4)) == []  # execute_input's count: no event
    cnt, res = shaper.shape(Output("result", data={"text/plain": "2"}, count=4))
    assert cnt["type"] == "execution_count" and cnt["execution_count"] == 4
    assert res["type"] == "result" and res["results"] == {"text": "2"}


def test_oversized_binary_result_is_dropped_with_a_note():
    shaper = EventShaper(1000, 10)
    (ev,) = shaper.shape(Output("result", data={"image/png": "A" * 50, "text/plain": "fig"}))
    assert "image/png" not in ev["results"]
    assert ev["results"]["text"].startswith("fig\n[image/png output of")


def test_stream_cap_marks_once_then_drops():
    shaper = EventShaper(10, 100)
    first = shaper.shape(Output("stdout", text="12345"))
    second = shaper.shape(Output("stderr", text="abcdefgh"))
    third = shaper.shape(Output("stdout", text="more"))
    assert first[0]["text"] == "12345"
    assert second[0]["text"].startswith("abcde\n[output truncated")
    assert third == []


def test_error_is_preceded_by_an_error_status_as_the_reference():
    shaper = EventShaper(10, 10)
    status, err = shaper.shape(Output("error", ename="ValueError", evalue="bad", traceback=["t"]))
    assert status["type"] == "status" and status["text"] == "error"
    assert err["error"] == {"ename": "ValueError", "evalue": "bad", "traceback": ["t"]}
    assert shaper.shape(Output("count")) == []


def test_catalog_resolves_specs_and_aliases(tmp_path: Path):
    image_dir = tmp_path / "image-kernels"
    (image_dir / "mybash").mkdir(parents=True)
    (image_dir / "mybash" / "kernel.json").write_text(json.dumps(
        {"argv": ["bash", "-c", "true", "{connection_file}"], "language": "Bash",
         "display_name": "B"}))
    (image_dir / "ghost").mkdir()
    (image_dir / "ghost" / "kernel.json").write_text(json.dumps(
        {"argv": ["/no/such/interpreter", "{connection_file}"], "language": "ghostlang"}))
    (image_dir / "broken").mkdir()
    (image_dir / "broken" / "kernel.json").write_text("{not json")
    catalog = KernelCatalog((str(image_dir),), "/usr/bin:/bin")
    specs = catalog.discover()
    assert specs["bash"].kind == "jupyter"
    argv = catalog.ksm.get_kernel_spec(specs["bash"].target).argv
    assert Path(argv[0]).is_absolute() and argv[0].endswith("/bash")
    assert "ghostlang" not in specs
    # python comes from an interpreter with ipykernel (this venv's at least).
    assert specs["python"].kind == "jupyter"
    assert Path(catalog.ksm.get_kernel_spec(specs["python"].target).argv[0]).is_absolute()
    limited = catalog.discover(("sh",))
    assert list(limited) == ["bash"]
    assert canonical("JS") == "javascript" and canonical("python3") == "python"


def test_settings_from_env():
    s = CodeSettings.from_env({
        "SANDLOT_CODE_PRESTART": "python, bash", "SANDLOT_CODE_STRIP_ENV": "*KEY*;*TOKEN*",
        "SANDLOT_CODE_MAX_OUTPUT_BYTES": "123", "JUPYTER_PORT": "5000",
    })
    assert s.prestart == ("python", "bash")
    assert s.strip_env == ("*KEY*", "*TOKEN*")
    assert s.max_output_bytes == 123 and s.ready_port == 5000
    assert CodeSettings.from_env({"SANDLOT_CODE_READY_PORT": "0"}).ready_port == 0
    assert CodeSettings.from_env({}).prestart == ()
    with pytest.raises(ValueError):
        CodeSettings.from_env({"SANDLOT_CODE_EXEC_TIMEOUT": "soon"})


def test_exit_status_helpers(tmp_path: Path):
    assert KernelDied(-9).killed and not KernelDied(1).killed
    assert "SIGKILL" in str(KernelDied(-9))
    assert returncode(None, 3) == 3
    (tmp_path / "memory.oom_control").write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert oom_kills(tmp_path) == 2
    assert oom_kills(None) is None
    watch = OomWatch(None)
    assert watch.was_oom(True) and not watch.was_oom(False)


@pytest.mark.skipif(sys.platform != "linux", reason="cgroups are Linux")
def test_oom_counter_readable_for_self():
    import os

    from sandlot.execd.code.oom import memory_cgroup

    cg = memory_cgroup(os.getpid())
    assert cg is None or cg.is_dir()


class _FakeKernel:
    """Stands in for a started kernel in pool tests (the pool only asks these two things)."""

    def __init__(self, n: int) -> None:
        self.n = n

    async def is_alive(self) -> bool:
        return True

    async def shutdown(self) -> None:
        return None


async def test_pool_replaces_a_still_starting_kernel_only_once_it_is_up():
    import asyncio

    from sandlot.execd.code.pool import WarmPool

    started: list[int] = []
    gates: list[asyncio.Event] = []

    async def start(language: str) -> _FakeKernel:
        started.append(len(started))
        gate = asyncio.Event()
        gates.append(gate)
        await gate.wait()
        return _FakeKernel(len(started) - 1)

    pool = WarmPool(start)  # type: ignore[arg-type]
    pool.fill("python")
    await asyncio.sleep(0)
    assert started == [0]
    taking = asyncio.create_task(pool.take("python"))  # the kernel is still starting
    await asyncio.sleep(0.01)
    assert started == [0], "a replacement started beside a kernel that was still starting"
    gates[0].set()
    kernel = await taking
    assert isinstance(kernel, _FakeKernel) and kernel.n == 0
    await asyncio.sleep(0)
    assert started == [0, 1], "no replacement once the taken kernel was up"
    gates[1].set()
    for _ in range(3):  # the second kernel finishes starting
        await asyncio.sleep(0)
    # A ready kernel is replaced at once, while the caller takes it.
    second = await pool.take("python")
    assert isinstance(second, _FakeKernel) and second.n == 1
    await asyncio.sleep(0)
    assert started == [0, 1, 2]
    gates[2].set()
    await pool.close()
