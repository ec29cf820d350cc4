"""The execd zygote compiles each seccomp object once; forked execds load that program.

The end-to-end check (a forked execd's seccomp state equals runc's execd's) is in
tests/security/test_zygote.py; these pin the pieces without a sandbox.
"""

from __future__ import annotations

import errno
import os
from typing import Any

import pytest

pyseccomp = pytest.importorskip("pyseccomp")
pytest.importorskip("prctl")

from sandlot.execd import confine, zygote  # noqa: E402

# uname refused with EPERM: observable from the child, harmless to everything else.
PROFILE: dict[str, Any] = {
    "defaultAction": "SCMP_ACT_ALLOW",
    "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86"],
    "syscalls": [{"names": ["uname"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM}],
}


def _exported(filt: Any) -> bytes:
    read_end, write_end = os.pipe()
    with os.fdopen(read_end, "rb") as reader, os.fdopen(write_end, "wb") as writer:
        filt.export_bpf(writer)
        writer.close()
        return reader.read()


def test_the_compiled_program_is_what_libseccomp_loads() -> None:
    compiled = confine.CompiledFilter.of(confine.seccomp_filter(PROFILE))
    assert compiled is not None
    assert compiled.program.raw == _exported(confine.seccomp_filter(PROFILE))
    assert compiled.no_new_privs  # libseccomp's default, applied by its own load too


def test_a_filter_needing_load_flags_is_left_to_libseccomp() -> None:
    filt = confine.seccomp_filter(PROFILE)
    filt.set_attr(pyseccomp.Attr.CTL_LOG, 1)
    assert confine.CompiledFilter.of(filt) is None


def test_the_plan_decides_which_filter_an_execd_loads() -> None:
    filters = zygote.SeccompFilters()
    prebuilt = filters.get(PROFILE)
    assert prebuilt is not None
    reordered = {k: PROFILE[k] for k in reversed(list(PROFILE))}
    assert zygote.filter_for({"seccomp": reordered}, prebuilt) is prebuilt[1]
    other = {**PROFILE, "syscalls": []}
    own = zygote.filter_for({"seccomp": other}, prebuilt)
    assert own is not prebuilt[1]
    assert isinstance(own, pyseccomp.SyscallFilter)  # built from the plan, not the header's
    assert filters.get(PROFILE) is not None and filters.get(PROFILE)[1] is prebuilt[1]


def test_the_cache_is_bounded_and_refuses_what_cannot_be_built() -> None:
    filters = zygote.SeccompFilters(limit=2)
    for n in range(4):
        assert filters.get({**PROFILE, "syscalls": PROFILE["syscalls"] * (n + 1)}) is not None
    assert len(filters) == 2
    assert filters.get({"defaultAction": "SCMP_ACT_TRACE"}) is None
    assert filters.get(None) is None


def _uname_errno_in_child(load: Any) -> int:
    """Fork, load the filter, call uname: the errno it failed with (0: allowed)."""
    pid = os.fork()
    if pid == 0:
        code = 100
        try:
            load()
            try:
                os.uname()
                code = 0
            except OSError as exc:
                code = exc.errno or 99
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_the_compiled_program_refuses_as_the_library_loaded_one() -> None:
    compiled = confine.CompiledFilter.of(confine.seccomp_filter(PROFILE))
    assert compiled is not None
    assert _uname_errno_in_child(compiled.load) == errno.EPERM
    assert _uname_errno_in_child(confine.seccomp_filter(PROFILE).load) == errno.EPERM
    assert _uname_errno_in_child(lambda: None) == 0
