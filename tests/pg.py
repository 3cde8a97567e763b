"""A throwaway PostgreSQL server for the class-store tests: initdb into a temporary folder, pg_ctl start on a free
loopback port, stopped and deleted afterwards. Run as the ``postgres`` user when the tests run as root (PostgreSQL
refuses to run as root). `start` returns None with the reason when there is no PostgreSQL to start."""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass


def _bindir() -> str | None:
    """Debian puts the server binaries under /usr/lib/postgresql/<version>/bin; elsewhere they are on PATH."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return os.path.dirname(found[-1])
    initdb = shutil.which("initdb")
    return os.path.dirname(initdb) if initdb else None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Postgres:
    url: str  # postgresql+psycopg://... for the store
    folder: str
    bindir: str
    user: str | None

    def _run(self, *args: str) -> subprocess.CompletedProcess:
        return _as(self.user, [os.path.join(self.bindir, args[0]), *args[1:]])

    def stop(self) -> None:
        self._run("pg_ctl", "-D", os.path.join(self.folder, "db"), "-m", "immediate", "-w", "stop")
        shutil.rmtree(self.folder, ignore_errors=True)


def _as(user: str | None, cmd: list[str]) -> subprocess.CompletedProcess:
    if user:
        cmd = ["runuser", "-u", user, "--", *cmd]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def start() -> tuple[Postgres | None, str]:
    """(a running server, "") or (None, why not)."""
    bindir = _bindir()
    if bindir is None:
        return None, "no PostgreSQL server binaries (initdb) on this machine: install Debian's postgresql"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return None, "psycopg is not installed (requirements.txt)"
    user = None
    if os.geteuid() == 0:  # PostgreSQL will not run as root
        try:
            user = pwd.getpwnam("postgres").pw_name
        except KeyError:
            return None, "running as root and there is no postgres user to run the server as"
    folder = tempfile.mkdtemp(prefix="atlas-pg-")
    if user:
        os.chmod(folder, 0o755)
        shutil.chown(folder, user)
    port = _free_port()
    db = os.path.join(folder, "db")
    server = Postgres(f"postgresql+psycopg://atlas@127.0.0.1:{port}/atlas", folder, bindir, user)
    steps = [
        ["initdb", "-D", db, "-U", "atlas", "--auth=trust", "-E", "UTF8", "--no-sync"],
        ["pg_ctl", "-D", db, "-o", f"-p {port} -k {folder} -c listen_addresses=127.0.0.1 -c fsync=off", "-w",
         "-t", "60", "-l", os.path.join(folder, "log"), "start"],
        ["createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "atlas", "atlas"],
    ]
    for step in steps:
        done = _as(user, [os.path.join(bindir, step[0]), *step[1:]])
        if done.returncode != 0:
            if step[0] != "initdb":
                server.stop()
            else:
                shutil.rmtree(folder, ignore_errors=True)
            return None, f"{step[0]} failed: {(done.stderr or done.stdout).strip()[-300:]}"
    return server, ""
