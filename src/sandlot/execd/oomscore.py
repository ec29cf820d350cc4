"""Make execd the OOM killer's last choice: its children get a much higher ``oom_score_adj``.

execd is PID 1 of a sandbox; if the OOM killer picked it (it picks the largest process among
equals, and execd is often larger than a small worker), the whole sandbox would go. Raising a
score needs no privilege, so every child execd starts is raised, whatever execd's own value.

The raise happens right after the (v)fork, not in the child before it execs (that would need a
``preexec_fn``, which rules out vfork). A process the child forks in its first moments keeps
execd's own score; that is harmless: the OOM killer still picks every raised process first,
and between equals the larger, which is not execd when the workload is the one using memory.
"""

from __future__ import annotations

import os
from pathlib import Path

# How much more the OOM killer should prefer execd's children than execd: nearly the whole range,
# so a command or kernel (and whatever it starts) is killed before execd whatever their sizes.
CHILD_OOM_PREFERENCE = 999


def _read_adj(pid: int | str) -> int:
    return int(Path(f"/proc/{pid}/oom_score_adj").read_text().strip() or "0")


def child_oom_score_adj() -> int:
    """The ``oom_score_adj`` execd's children get: execd's own plus the preference, within 0..1000.

    With execd protected by the runtime (-999, when the host grants CAP_SYS_RESOURCE) that is 0;
    without (execd at 0, since lowering needs the capability) it is 999. Either way the OOM
    killer picks a child before execd, which must survive: it is the sandbox's PID 1.
    """
    try:
        own = _read_adj("self")
    except (OSError, ValueError):
        own = 0
    return max(0, min(1000, own + CHILD_OOM_PREFERENCE))


def _children() -> dict[int, list[int]]:
    """Parent pid -> child pids, from /proc/*/stat (``task/*/children`` needs a kernel option)."""
    tree: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        tree.setdefault(ppid, []).append(int(entry.name))
    return tree


def prefer_for_oom(pid: int | None, adj: int | None = None) -> None:
    """Raise ``pid`` and its descendants (e.g. bash_kernel's bash) to ``adj`` (default
    :func:`child_oom_score_adj`) so the OOM killer picks them before execd.

    Raising needs no privilege; failures (no /proc, a process already gone) are ignored.
    """
    if not pid:
        return
    target = child_oom_score_adj() if adj is None else adj
    tree = _children()
    todo, seen = [pid], set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        todo.extend(tree.get(current, []))
        try:
            if _read_adj(current) < target:
                Path(f"/proc/{current}/oom_score_adj").write_text(str(target))
        except (OSError, ValueError):
            continue


_child_adj: bytes | None = None


def remember_child_adj() -> bytes:
    """Read execd's score now (at start-up) so ``prefer_child`` need not, racing the child."""
    global _child_adj
    _child_adj = str(child_oom_score_adj()).encode()
    return _child_adj


def prefer_child(pid: int) -> None:
    """Raise a just-started child (not yet forked further) above execd; best effort.

    execd's own score is read once (it does not change while execd runs): this is on the
    path of every command.
    """
    adj = _child_adj if _child_adj is not None else remember_child_adj()
    try:
        fd = os.open(f"/proc/{pid}/oom_score_adj", os.O_WRONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        os.write(fd, adj)
    except OSError:
        pass
    finally:
        os.close(fd)
