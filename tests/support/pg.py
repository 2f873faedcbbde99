"""A real PostgreSQL server for tests and benches: a throwaway cluster made with `initdb` in a
temporary folder, started with `pg_ctl`, listening only on a unix socket inside that folder.

    server = Postgres()                   # started (trust auth, superuser `postgres`)
    url = server.create_database()        # a fresh, empty database: postgresql://...
    server.restart()                      # pg_ctl restart -m fast (stop_server / start_server too)
    server.stop()                         # always: stops it and removes the folder

initdb refuses to run as root: as root, the cluster is made and run as the `postgres` user (made
by Debian's postgresql package) or `nobody`. initdb runs once per machine, user and PostgreSQL
build (about 0.7 s of CPU, and every test worker and bench wants a cluster): its result is kept in
the temporary folder and each cluster starts as a copy of it. Binaries are found on PATH or in Debian's
/usr/lib/postgresql/<version>/bin (scripts/test.sh installs the package when none is there).
Importable from any test or bench (no pytest here).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import uuid
from pathlib import Path

START_TIMEOUT_S = 60


def _bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"),
                      key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if not versions:
        raise RuntimeError(f"PostgreSQL's {name} is not installed (scripts/test.sh installs Debian's postgresql)")
    return versions[-1]


def _as_user() -> list[str]:
    """The prefix that runs a command as a user initdb accepts (not root)."""
    if os.geteuid() != 0:
        return []
    for user in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(user)
            return [shutil.which("runuser") or "/usr/sbin/runuser", "-u", user, "--"]
    raise RuntimeError("running as root and no `postgres` or `nobody` user to run PostgreSQL as")


def _template(prefix: list[str]) -> Path | None:
    """A cluster fresh from initdb, made once (under a lock, moved into place whole) and kept for
    every later cluster of this user and PostgreSQL build; None where the kept one cannot be trusted.
    It lives in a folder of this user's in the temporary folder that nobody else may write to (mode
    0711: the cluster's user passes through it to copy its files): a cluster planted there by another
    account (a configuration that runs a command) would otherwise start as ours."""
    initdb = _bin("initdb")
    st = os.stat(os.path.realpath(initdb))
    build = hashlib.sha1(f"{initdb} {st.st_size} {st.st_mtime_ns} {prefix}".encode()).hexdigest()[:12]
    home = Path(tempfile.gettempdir()) / f"actor-run-pg-initdb-{os.geteuid()}"
    with contextlib.suppress(FileExistsError):
        home.mkdir(mode=0o711)
    owner = os.lstat(home)
    if not stat.S_ISDIR(owner.st_mode) or owner.st_uid != os.geteuid() or owner.st_mode & 0o022:
        return None
    kept = home / build
    with open(home / f"{build}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (kept / "data" / "PG_VERSION").exists():
            staging = Path(tempfile.mkdtemp(prefix=f"{build}-", dir=home))
            try:
                if prefix:
                    pw = pwd.getpwnam(prefix[2])
                    os.chown(staging, pw.pw_uid, pw.pw_gid)
                _initdb(prefix, staging / "data")
                shutil.rmtree(kept, ignore_errors=True)
                os.rename(staging, kept)
            finally:
                shutil.rmtree(staging, ignore_errors=True)  # (gone already once renamed)
    return kept / "data"


def _initdb(prefix: list[str], data: Path) -> None:
    subprocess.run([*prefix, _bin("initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                    "--no-sync"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


class Postgres:
    def __init__(self, *, settings: dict[str, str] | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="actor-run-pg-"))
        self.data = self.dir / "data"
        self.socket_dir = self.dir
        prefix = _as_user()
        if prefix:
            user = prefix[2]
            pw = pwd.getpwnam(user)
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self._prefix = prefix
        template = _template(prefix)
        if template is None:
            _initdb(prefix, self.data)
        else:  # a copy made as the cluster's user (owner and mode 0700 are what the server checks)
            subprocess.run([*prefix, "cp", "-a", str(template), str(self.data)], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        options = {"listen_addresses": "''", "unix_socket_directories": f"'{self.socket_dir}'", "fsync": "off",
                   "max_connections": "200", **(settings or {})}
        opts = " ".join(f"-c {k}={v}" for k, v in options.items())
        self._opts = opts
        self.start_server()
        self.url = self.url_for("postgres")

    def _ctl(self, *args: str) -> None:
        subprocess.run([*self._prefix, _bin("pg_ctl"), "-D", str(self.data), *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def start_server(self) -> None:
        """Start the server (waits until it accepts connections)."""
        self._ctl("-o", self._opts, "-l", str(self.dir / "log"), "-w", "-t", str(START_TIMEOUT_S), "start")

    def stop_server(self) -> None:
        """Stop the server, keeping its data (`start_server` brings it back)."""
        self._ctl("-m", "fast", "-w", "stop")

    def restart(self) -> None:
        """`pg_ctl restart -m fast`: every session is ended (clients see AdminShutdown), the server
        comes back on the same socket with the same data; returns once it accepts connections."""
        self._ctl("-m", "fast", "-o", self._opts, "-l", str(self.dir / "log"), "-w", "-t", str(START_TIMEOUT_S),
                  "restart")

    def url_for(self, database: str) -> str:
        return f"postgresql://postgres@/{database}?host={self.socket_dir}"

    def create_database(self) -> str:
        import psycopg

        name = "t_" + uuid.uuid4().hex[:12]
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url_for(name)

    def pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                subprocess.run([*self._prefix, _bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w",
                                "stop"], check=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
