"""A throwaway PostgreSQL server for the tests: Debian's binaries, a data directory in /tmp,
TCP on 127.0.0.1 only (no Unix socket), password (SCRAM) authentication.

The tests start one per session (``tests/conftest.py``) and give each test a database of its
own. ``.ci/run`` installs Debian's ``postgresql``; on a machine without it the PostgreSQL tests
are skipped with the reason :func:`find_binaries` gives (under CI they fail instead).

PostgreSQL refuses to run as root; under root the server runs as the ``postgres`` system user
that Debian's package creates. Durability is switched off (``fsync``, ``synchronous_commit``,
``full_page_writes``): the data is thrown away after the session, and what the tests check is
what the server stores and returns, not what survives a power cut.
"""

from __future__ import annotations

import atexit
import glob
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

from ports import free_port

USER = "autotune"
SEARCH_PATH = ("/usr/lib/postgresql/*/bin",)
"""Where Debian's packages put initdb and postgres (only the client tools are on PATH)."""
START_TIMEOUT_S = 120.0


def find_binaries() -> tuple[Path | None, str]:
    """(the directory holding ``initdb`` and ``postgres``, '') or (None, why not)."""
    on_path = shutil.which("initdb")
    if on_path and shutil.which("postgres"):
        return Path(os.path.realpath(on_path)).parent, ""
    # Highest version first: /usr/lib/postgresql/15/bin before .../13/bin.
    for directory in sorted(
        (d for pattern in SEARCH_PATH for d in glob.glob(pattern)),
        key=lambda d: [int(p) if p.isdigit() else 0 for p in Path(d).parent.name.split(".")],
        reverse=True,
    ):
        if os.access(os.path.join(directory, "initdb"), os.X_OK) and os.access(
            os.path.join(directory, "postgres"), os.X_OK
        ):
            return Path(directory), ""
    return None, (
        "PostgreSQL server binaries (initdb, postgres) not found on PATH or in "
        "/usr/lib/postgresql/*/bin; apt-get install postgresql (.ci/run does)"
    )


def _run_as() -> tuple[str | None, str]:
    """(user to run the server as, or None for the current user; why not, when impossible)."""
    if os.geteuid() != 0:
        return None, ""
    try:
        pwd.getpwnam("postgres")
    except KeyError:
        return None, (
            "running as root, and there is no 'postgres' user to run the server as "
            "(PostgreSQL refuses root); apt-get install postgresql creates it"
        )
    return "postgres", ""


class PostgresServer:
    """One running server; :meth:`url` names a database on it (with the password)."""

    def __init__(self, bin_dir: Path, user: str | None) -> None:
        self.bin_dir, self.run_as = bin_dir, user
        self.password = "pw-" + secrets.token_hex(8)
        # Not under pytest's tmp_path: its parents are private to the current user.
        self.directory = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
        self.data = self.directory / "data"
        self.log = self.directory / "server.log"
        self.port = 0
        self._process: subprocess.Popen | None = None
        self._databases: set[str] = set()

    @classmethod
    def start(cls) -> PostgresServer:
        """Initialises a cluster and starts the server; raises RuntimeError with the reason."""
        bin_dir, why = find_binaries()
        if bin_dir is None:
            raise RuntimeError(why)
        user, why = _run_as()
        if why:
            raise RuntimeError(why)
        server = cls(bin_dir, user)
        try:
            server._init()
            server._launch()
        except BaseException:
            server.stop()
            raise
        atexit.register(server.stop)  # should the caller's own teardown never run
        return server

    def _subprocess_kwargs(self) -> dict:
        return {"user": self.run_as} if self.run_as else {}

    def _init(self) -> None:
        pwfile = self.directory / "pwfile"
        pwfile.write_text(self.password + "\n")
        if self.run_as:
            entry = pwd.getpwnam(self.run_as)
            for path in (self.directory, pwfile):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        proc = subprocess.run(
            [
                str(self.bin_dir / "initdb"),
                "-D",
                str(self.data),
                "-U",
                USER,
                "--pwfile",
                str(pwfile),
                "--auth",
                "scram-sha-256",
                "--encoding",
                "UTF8",
                "--locale",
                "C",
                "--no-sync",
            ],
            capture_output=True,
            text=True,
            timeout=START_TIMEOUT_S,
            **self._subprocess_kwargs(),
        )
        pwfile.unlink()
        if proc.returncode != 0:
            raise RuntimeError(f"initdb failed: {proc.stderr.strip()[-500:]}")

    def _launch(self) -> None:
        for _attempt in range(3):  # the free port may be taken before the server binds it
            self.port = free_port()
            with open(self.log, "ab") as log:
                self._process = subprocess.Popen(
                    [
                        str(self.bin_dir / "postgres"),
                        "-D",
                        str(self.data),
                        "-c",
                        "listen_addresses=127.0.0.1",
                        "-c",
                        f"port={self.port}",
                        "-c",
                        "unix_socket_directories=",
                        "-c",
                        "fsync=off",
                        "-c",
                        "synchronous_commit=off",
                        "-c",
                        "full_page_writes=off",
                        "-c",
                        "max_connections=100",
                    ],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    **self._subprocess_kwargs(),
                )
            if self._wait_ready():
                return
            self._process.wait(timeout=10)
        raise RuntimeError(f"postgres did not start: {self.log.read_text()[-500:]}")

    def _wait_ready(self) -> bool:
        import psycopg

        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                return False
            try:
                psycopg.connect(self._conninfo("postgres"), connect_timeout=5).close()
                return True
            except psycopg.OperationalError:
                time.sleep(0.1)
        self._process.kill()
        return False

    def _conninfo(self, database: str) -> str:
        return (
            f"host=127.0.0.1 port={self.port} user={USER} password={self.password} "
            f"dbname={database}"
        )

    def url(self, database: str) -> str:
        """SQLAlchemy URL of ``database`` on this server, the password in it."""
        return f"postgresql+psycopg://{USER}:{self.password}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str) -> str:
        """A new empty database; returns its URL."""
        import psycopg

        with psycopg.connect(self._conninfo("postgres"), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def create_schema(self, database: str, name: str) -> str:
        """A new empty schema in ``database`` (created first if need be); returns the URL of
        ``database`` with the schema as the connections' ``search_path``, so that everything
        unqualified (autotune's tables, Optuna's) lives in it.

        A test's own namespace for a few milliseconds, where a new database costs a second or
        more on a loaded machine (CREATE DATABASE copies the template)."""
        import psycopg

        if database not in self._databases:
            self.create_database(database)
            self._databases.add(database)
        with psycopg.connect(self._conninfo(database), autocommit=True) as connection:
            connection.execute(f'CREATE SCHEMA "{name}"')
        return f"{self.url(database)}?options=-csearch_path%3D{name}"

    def stop(self) -> None:
        """Stops the server (fast shutdown) and removes its directory."""
        if self._process is not None and self._process.poll() is None:
            self._process.send_signal(signal.SIGINT)  # fast shutdown: ends open sessions
            try:
                self._process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)
