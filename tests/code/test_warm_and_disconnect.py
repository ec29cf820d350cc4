"""Pre-started kernels are handed out and replaced; a client that goes away stops its cell."""

from __future__ import annotations

import time

import httpx
import psutil

from .conftest import TOKEN


def _kernels(execd, marker: str) -> list[psutil.Process]:
    procs = []
    for p in psutil.Process(execd.proc.pid).children(recursive=True):
        try:
            if any(marker in part for part in p.cmdline()):
                procs.append(p)
        except psutil.NoSuchProcess:
            pass
    return procs


def _wait_for(predicate, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.1)
    return False


def test_prestarted_kernel_is_handed_out_and_replaced(execd):
    with execd.client() as c:
        for ctx in c.get("/code/contexts", params={"language": "python"}).json():
            c.delete(f"/code/contexts/{ctx['id']}")
        assert _wait_for(lambda: len(_kernels(execd, "ipykernel_launcher")) == 1)
        warm = _kernels(execd, "ipykernel_launcher")[0].pid
        ctx = c.post("/code/context", json={"language": "python"}).json()
        text = c.post("/code", json={"code": "import os; os.getpid()", "context": ctx}).text
        assert f'"text":"{warm}"' in text.replace(" ", "")
        # A new idle kernel replaces the one handed out.
        assert _wait_for(lambda: len(_kernels(execd, "ipykernel_launcher")) == 2)
        c.delete(f"/code/contexts/{ctx['id']}")


def test_client_disconnect_interrupts_the_cell(execd):
    with execd.client() as c:
        ctx = c.post("/code/context", json={"language": "python"}).json()
        c.post("/code", json={"code": "n = 1", "context": ctx})
    with httpx.Client(timeout=30) as client:
        with client.stream("POST", execd.url + "/code", headers={"X-EXECD-ACCESS-TOKEN": TOKEN},
                           json={"code": "print('go', flush=True)\nwhile True: pass",
                                 "context": ctx}) as r:
            for line in r.iter_lines():
                if '"stdout"' in line:
                    break  # leave mid-run
    with execd.client() as c:
        # The context is free again (once the interrupt has landed: until then a run is
        # refused as busy, as the reference refuses it) and kept its state.
        for _ in range(100):
            r = c.post("/code", json={"code": "n + 1", "context": ctx}, timeout=30)
            if "ContextBusy" not in r.text:
                break
            time.sleep(0.1)
        assert '"text":"2"' in r.text.replace(" ", "")
        c.delete(f"/code/contexts/{ctx['id']}")
