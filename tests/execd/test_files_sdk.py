"""The released SDK's ``files`` and ``metrics`` APIs against a real execd."""

from __future__ import annotations

import io
import os
import stat

import pytest
from opensandbox.exceptions import SandboxException
from opensandbox.models.filesystem import (
    ContentReplaceEntry,
    DirectoryListEntry,
    MoveEntry,
    SearchEntry,
    SetPermissionEntry,
    WriteEntry,
)


async def test_write_read_and_info(sdk, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, files, _ = sdk
    target = tmp_path / "deep" / "hello.txt"
    await files.write_file(str(target), "hello world\n", mode=640)
    assert target.read_text() == "hello world\n"
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert await files.read_file(str(target)) == "hello world\n"
    info = await files.get_file_info([str(target)])
    entry = info[str(target)]
    assert entry.size == 12 and entry.mode == 640 and entry.owner == "root"
    assert entry.entry_type == "file"


async def test_write_several_files_bytes_and_stream(sdk, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, files, _ = sdk
    blob = os.urandom(300_000)
    await files.write_files(
        [
            WriteEntry(path=str(tmp_path / "a.bin"), data=blob, mode=600),
            WriteEntry(path=str(tmp_path / "b.txt"), data="text"),
            WriteEntry(path=str(tmp_path / "c.bin"), data=io.BytesIO(b"from a stream")),
        ]
    )
    assert (tmp_path / "a.bin").read_bytes() == blob
    assert stat.S_IMODE((tmp_path / "a.bin").stat().st_mode) == 0o600
    assert (tmp_path / "b.txt").read_text() == "text"
    assert (tmp_path / "c.bin").read_bytes() == b"from a stream"
    assert await files.read_bytes(str(tmp_path / "a.bin")) == blob
    assert (
        await files.read_bytes(str(tmp_path / "a.bin"), range_header="bytes=10-19") == blob[10:20]
    )
    chunks = [c async for c in await files.read_bytes_stream(str(tmp_path / "a.bin"))]
    assert b"".join(chunks) == blob


async def test_line_based_read(sdk, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, files, _ = sdk
    path = tmp_path / "lines.txt"
    path.write_bytes(b"".join(b"l%d\r\n" % i for i in range(1, 11)))
    # As the reference: lines without their endings, joined by \n, none after the last.
    assert await files.read_file(str(path), offset=3, limit=2) == "l3\nl4"
    assert await files.read_file(str(path), offset=9) == "l9\nl10"


async def test_directories_list_mkdir_delete(sdk, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, files, _ = sdk
    root = tmp_path / "tree"
    await files.create_directories(
        [WriteEntry(path=str(root / "b" / "inner"), mode=700), WriteEntry(path=str(root / "a"))]
    )
    assert stat.S_IMODE((root / "b" / "inner").stat().st_mode) == 0o700
    (root / "a" / "f.txt").write_text("x")
    (root / "z.txt").write_text("y")
    os.symlink(root / "a", root / "link")
    top = await files.list_directory(DirectoryListEntry(path=str(root)))
    assert [e.path for e in top] == [str(root / n) for n in ("a", "b", "link", "z.txt")]
    kinds = {os.path.basename(e.path): e.entry_type for e in top}
    assert kinds == {"a": "directory", "b": "directory", "link": "symlink", "z.txt": "file"}
    deep = await files.list_directory(DirectoryListEntry(path=str(root), depth=2))
    assert [e.path for e in deep] == [
        str(root / "a"),
        str(root / "a" / "f.txt"),
        str(root / "b"),
        str(root / "b" / "inner"),
        str(root / "link"),
        str(root / "z.txt"),
    ]
    await files.delete_directories([str(root / "b")])
    assert not (root / "b").exists()
    await files.delete_files([str(root / "z.txt")])
    assert not (root / "z.txt").exists()


async def test_move_chmod_replace_search(sdk, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, files, _ = sdk
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "one.py").write_text("DEBUG = True\nDEBUG = True\n")
    (tmp_path / "src" / "two.txt").write_text("nothing")
    (tmp_path / "src" / "pkg").mkdir()
    (tmp_path / "src" / "pkg" / "three.py").write_text("x = 1\n")
    await files.move_files(
        [MoveEntry(src=str(tmp_path / "src" / "two.txt"), dest=str(tmp_path / "moved.txt"))]
    )
    assert (tmp_path / "moved.txt").read_text() == "nothing"
    await files.set_permissions(
        [SetPermissionEntry(path=str(tmp_path / "moved.txt"), mode=600, owner="nobody")]
    )
    st = (tmp_path / "moved.txt").stat()
    assert stat.S_IMODE(st.st_mode) == 0o600
    import pwd

    assert st.st_uid == pwd.getpwnam("nobody").pw_uid
    results = await files.replace_contents_detailed(
        [
            ContentReplaceEntry(
                path=str(tmp_path / "src" / "one.py"), old_content="True", new_content="False"
            )
        ]
    )
    assert results[0].replaced_count == 2
    assert (tmp_path / "src" / "one.py").read_text() == "DEBUG = False\nDEBUG = False\n"
    found = await files.search(SearchEntry(path=str(tmp_path / "src"), pattern="*.py"))
    assert sorted(e.path for e in found) == [
        str(tmp_path / "src" / "one.py"),
        str(tmp_path / "src" / "pkg" / "three.py"),
    ]
    # The reference matches base names: a pattern with a directory part matches nothing,
    # {a,b} alternatives and ** work.
    found = await files.search(SearchEntry(path=str(tmp_path / "src"), pattern="pkg/*.py"))
    assert found == []
    found = await files.search(SearchEntry(path=str(tmp_path / "src"), pattern="{three,one}.py"))
    assert len(found) == 2


async def test_missing_paths_raise(sdk, tmp_path) -> None:  # type: ignore[no-untyped-def]
    _, files, _ = sdk
    with pytest.raises(SandboxException):
        await files.read_file(str(tmp_path / "nope"))
    with pytest.raises(SandboxException):
        await files.get_file_info([str(tmp_path / "nope")])


async def test_metrics(sdk) -> None:  # type: ignore[no-untyped-def]
    _, _, metrics = sdk
    m = await metrics.get_metrics("standalone")
    assert m.cpu_count >= 1
    assert 0 <= m.cpu_used_percentage <= 100
    assert m.memory_total_in_mib > 0
    assert 0 < m.memory_used_in_mib <= m.memory_total_in_mib
