"""A throwaway PostgreSQL server for tests: Debian's ``postgresql`` package, run by hand.

``running_postgres()`` runs ``initdb`` in a fresh temp dir, starts the server with
``pg_ctl`` listening only on 127.0.0.1 (a free port) and on a unix socket inside the temp dir,
and stops it and deletes the temp dir on the way out, even when the body or the start-up
failed. When the tests run as root, the server runs as the ``postgres`` OS user (PostgreSQL
refuses to run as root).

TCP logins use a password (scram-sha-256) and a non-superuser role, ``sandlot``, that owns
the databases it gets: the way a real deployment would be set up, and on PostgreSQL 15+ the
owner is what may create tables in ``public``. The server runs in a non-UTC time zone so
that time-zone mistakes in the store show up.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

PG_USER = "postgres"
ROLE = "sandlot"
SERVER_TIMEZONE = "Pacific/Chatham"  # UTC+12:45/+13:45: odd offsets catch naive datetimes


def find_pg_bin() -> Path | None:
    """The newest ``/usr/lib/postgresql/<major>/bin`` holding initdb and pg_ctl."""
    found = []
    for d in Path("/usr/lib/postgresql").glob("*/bin"):
        if (d / "initdb").is_file() and (d / "pg_ctl").is_file() and d.parent.name.isdigit():
            found.append((int(d.parent.name), d))
    return max(found)[1] if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PostgresServer:
    bin_dir: Path
    root: Path
    port: int
    password: str

    @property
    def version(self) -> str:
        return (self.root / "data" / "PG_VERSION").read_text().strip()

    @property
    def socket_dir(self) -> Path:
        return self.root / "sock"

    def url(self, database: str) -> str:
        """SQLAlchemy async URL of ``database``, over TCP with the ``sandlot`` role."""
        return f"postgresql+asyncpg://{ROLE}:{self.password}@127.0.0.1:{self.port}/{database}"

    def psql(self, sql: str, database: str = "postgres") -> str:
        """Run ``sql`` as the superuser over the unix socket; return its output."""
        return _run_as_pg(
            [
                str(self.bin_dir / "psql"),
                "-X",
                "-q",
                "-t",
                "-A",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                str(self.socket_dir),
                "-p",
                str(self.port),
                "-U",
                PG_USER,
                "-d",
                database,
                "-c",
                sql,
            ],
            cwd=self.root,
        )

    def create_database(self, name: str) -> str:
        """Create an empty database owned by the ``sandlot`` role; return its URL."""
        self.psql(f'CREATE DATABASE "{name}" OWNER {ROLE}')
        return self.url(name)

    def drop_database(self, name: str) -> None:
        self.psql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def restart(self) -> None:
        """Restart on the same port: every open client connection is cut."""
        _run_as_pg(
            [str(self.bin_dir / "pg_ctl"), "-D", str(self.root / "data"), "-m", "fast", "-w"]
            # -l again: without it the new postmaster would write to (and hold) our pipe.
            + ["-t", "60", "-l", str(self.root / "server.log"), "restart"],
            cwd=self.root,
            timeout=90,
        )


def _run_as_pg(args: Sequence[str], cwd: Path, timeout: float = 120) -> str:
    env = {"PATH": "/usr/bin:/bin", "LC_ALL": "C", "HOME": str(cwd)}
    as_root = os.geteuid() == 0  # then run as postgres, which refuses to run as root
    proc = subprocess.run(
        list(args),
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        user=PG_USER if as_root else None,
        group=pwd.getpwnam(PG_USER).pw_gid if as_root else None,
        extra_groups=[] if as_root else None,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args[:1])} failed ({proc.returncode}): {proc.stderr.strip()}"
        )
    return proc.stdout


def _stop(bin_dir: Path, root: Path) -> None:
    """Stop the server if it runs; kill the postmaster if pg_ctl cannot."""
    data = root / "data"
    pid_file = data / "postmaster.pid"
    if not pid_file.exists():
        return
    with contextlib.suppress(Exception):
        _run_as_pg(
            [str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "-t", "30", "stop"],
            cwd=root,
            timeout=60,
        )
    if pid_file.exists():  # pg_ctl failed or timed out: take the postmaster down by force
        with contextlib.suppress(Exception):
            pid = int(pid_file.read_text().split("\n", 1)[0])
            os.kill(pid, signal.SIGQUIT)
            for _ in range(100):
                os.kill(pid, 0)
                time.sleep(0.1)
            os.kill(pid, signal.SIGKILL)


def _start(bin_dir: Path, root: Path, attempts: int = 3) -> int:
    """Start the server on a free port (retrying if another process takes it first)."""
    data = root / "data"
    log = root / "server.log"
    for attempt in range(attempts):
        port = _free_port()
        options = " ".join(
            [
                "-c listen_addresses=127.0.0.1",
                f"-p {port}",
                f"-k {root / 'sock'}",
            ]
        )
        try:
            _run_as_pg(
                [
                    str(bin_dir / "pg_ctl"),
                    "-D",
                    str(data),
                    "-l",
                    str(log),
                    "-o",
                    options,
                    "-w",
                    "-t",
                    "60",
                    "start",
                ],
                cwd=root,
                timeout=90,
            )
            return port
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            _stop(bin_dir, root)
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            if attempt == attempts - 1:
                raise RuntimeError(f"PostgreSQL did not start: {exc}\n{tail}") from exc
    raise AssertionError("unreachable")


@contextlib.contextmanager
def running_postgres(bin_dir: Path) -> Iterator[PostgresServer]:
    """A started server in a fresh temp dir; stopped and deleted afterwards."""
    root = Path(tempfile.mkdtemp(prefix="sandlot-pg-", dir="/tmp"))
    try:
        (root / "sock").mkdir(mode=0o700)
        password = secrets.token_urlsafe(16)
        pwfile = root / "pwfile"
        pwfile.write_text(password + "\n")
        if os.geteuid() == 0:
            pg = pwd.getpwnam(PG_USER)
            for path in (root, root / "sock", pwfile):
                os.chown(path, pg.pw_uid, pg.pw_gid)
        _run_as_pg(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(root / "data"),
                "-U",
                PG_USER,
                f"--pwfile={pwfile}",
                "--auth-local=trust",  # the socket dir is 0700: only postgres/root reach it
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
            ],
            cwd=root,
        )
        pwfile.unlink()
        with open(root / "data" / "postgresql.conf", "a") as conf:
            conf.write(
                "\n# sandlot tests: throwaway data, so durability is not needed\n"
                "fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n"
                f"timezone = '{SERVER_TIMEZONE}'\n"
                "max_connections = 50\nshared_buffers = 16MB\n"
            )
        port = _start(bin_dir, root)
        server = PostgresServer(bin_dir=bin_dir, root=root, port=port, password=password)
        server.psql(f"CREATE ROLE {ROLE} LOGIN PASSWORD '{password}'")
        yield server
    finally:
        _stop(bin_dir, root)
        shutil.rmtree(root, ignore_errors=True)
