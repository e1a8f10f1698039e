"""A real PostgreSQL server as a child process on 127.0.0.1, for the tests, the cluster harness and the
cluster bench: a fresh cluster made with ``initdb``, password-authenticated (SCRAM), ready once the server
says so, restarted or killed by its owner, and removed when it stops.

The server binaries come from the machine (Debian's ``postgresql`` package puts them under
``/usr/lib/postgresql/<version>/bin``; ``make test`` installs it where it is missing). PostgreSQL refuses
to run as root, so as root the server runs as the ``postgres`` user that package creates, in a directory
of its own under the system's temporary directory (a pytest directory is private to root).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from stratalog.chaos.launch import dying_with_parent, run_to_end
from stratalog.chaos.ports import free_port, start_on_free_ports
from stratalog.errors import StratalogError

#: Where Debian's packages put each major version's server binaries.
DEBIAN_BIN_GLOB = "/usr/lib/postgresql/*/bin"
#: The user the server runs as when this process is root (Debian's package creates it).
SERVER_USER = "postgres"
#: The role and database the server is made with.
ROLE = "stratalog"
DATABASE = "stratalog"
#: How long initdb and a start may take on a loaded machine.
START_TIMEOUT_S = 60.0
#: The server's log line once it accepts connections.
READY_LINE = "database system is ready to accept connections"
#: Its log line when its port was taken between our pick and its bind (another process of a busy
#: machine picked the same free port): it is started again on another.
PORT_TAKEN_LINE = "Address already in use"


class PostgresUnavailableError(StratalogError):
    """No PostgreSQL server binaries on this machine, or the server would not start."""


def find_bin_dir() -> Path:
    """The newest PostgreSQL server's binary directory: ``pg_config --bindir`` if it has ``postgres``,
    else Debian's newest ``/usr/lib/postgresql/<version>/bin``."""
    candidates = sorted(Path("/").glob(DEBIAN_BIN_GLOB.lstrip("/")),
                        key=lambda p: int(p.parent.name) if p.parent.name.isdigit() else 0)
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            said = run_to_end([pg_config, "--bindir"], START_TIMEOUT_S)
            if said.returncode == 0:
                candidates.append(Path(said.stdout.strip()))
    for directory in reversed(candidates):
        if (directory / "postgres").is_file() and (directory / "initdb").is_file():
            return directory
    raise PostgresUnavailableError(
        "no PostgreSQL server found (looked for initdb and postgres in pg_config --bindir and "
        f"{DEBIAN_BIN_GLOB}): install Debian's postgresql package (make test does, as root)")


@dataclass
class PostgresServer:
    """One PostgreSQL cluster and (while it runs) its server process."""

    bin_dir: Path
    root: Path
    port: int
    password: str
    run_as: str | None
    process: subprocess.Popen[str] | None = None
    log: list[str] = field(default_factory=list)
    #: Addresses it listens on besides 127.0.0.1 (a test network's private link, never a public one).
    extra_listen: tuple[str, ...] = ()

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def dsn(self) -> str:
        """A libpq connection URI for the stratalog role and database."""
        return self.dsn_at("127.0.0.1")

    def dsn_at(self, host: str) -> str:
        """The same, through another address it listens on (``extra_listen``)."""
        return f"postgresql://{ROLE}:{self.password}@{host}:{self.port}/{DATABASE}"

    def _command(self, *argv: str) -> list[str]:
        return dying_with_parent(argv, self.run_as)

    def init(self) -> None:
        password_file = self.root / "password"
        password_file.write_text(self.password + "\n")
        self._own(password_file)
        result = run_to_end(
            self._command(str(self.bin_dir / "initdb"), "-D", str(self.data_dir), "-U", ROLE, "-E", "UTF8",
                          "--auth=scram-sha-256", f"--pwfile={password_file}", "--no-instructions"),
            START_TIMEOUT_S)
        password_file.unlink()
        if result.returncode != 0:
            raise PostgresUnavailableError(f"initdb failed ({result.returncode}): {result.stderr.strip()}")
        if self.extra_listen:
            # Clients on those links log in as on loopback: with a password (initdb's lines cover 127.0.0.1).
            with (self.data_dir / "pg_hba.conf").open("a") as hba:
                hba.writelines(f"host all all {address}/30 scram-sha-256\n" for address in self.extra_listen)

    def start(self) -> None:
        """Start the server and wait until it accepts connections (its own log line says so)."""
        if self.process is not None and self.process.poll() is None:
            raise RuntimeError("the server is running already")
        ready = threading.Event()   # this process's own: a killed one's log may still be draining
        up = threading.Event()      # set at the ready line only (ready is also set when its log ends)
        self.process = subprocess.Popen(
            self._command(str(self.bin_dir / "postgres"), "-D", str(self.data_dir), "-p", str(self.port),
                          "-c", f"listen_addresses={','.join(('127.0.0.1', *self.extra_listen))}",
                          "-c", f"unix_socket_directories={self.root}",
                          "-c", "logging_collector=off", "-c", "max_connections=200"),
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
        threading.Thread(target=self._pump, args=(self.process, ready, up), name="stratalog-postgres-log",
                         daemon=True).start()
        # Not the exit status: a server that failed to start closes its log before it can be reaped.
        if not ready.wait(START_TIMEOUT_S) or not up.is_set() or self.process.poll() is not None:
            self.kill9()
            tail = "\n".join(self.log[-20:])
            raise PostgresUnavailableError(f"PostgreSQL did not become ready on 127.0.0.1:{self.port}:\n{tail}")

    def create_database(self) -> None:
        import psycopg

        with psycopg.connect(self.dsn.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {DATABASE}")

    def _pump(self, process: subprocess.Popen[str], ready: threading.Event, up: threading.Event) -> None:
        assert process.stderr is not None
        for line in process.stderr:
            self.log.append(line.rstrip("\n"))
            if READY_LINE in line:
                up.set()
                ready.set()
        process.stderr.close()
        ready.set()   # it ended: nobody waits for a line that will not come

    def stop(self) -> None:
        """A fast shutdown (SIGINT: open transactions roll back, everything committed is on disk)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(timeout=START_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.kill9()
        self.process = None

    def kill9(self) -> None:
        """SIGKILL the server and its children (a crash: what was committed survives, by its own WAL)."""
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=START_TIMEOUT_S)
        self.process = None
        # Its children (backends) died with the group; the postmaster.pid it left is stale and the next
        # start removes it.

    def restart(self) -> None:
        self.stop()
        self.start()

    def start_on_a_free_port(self) -> None:
        """The first start: on another free port if the one picked was taken before the server bound it."""
        def pick_again() -> None:
            self.log.clear()
            self.port = free_port()

        start_on_free_ports(self.start, lambda e: isinstance(e, PostgresUnavailableError) and any(
            PORT_TAKEN_LINE in line for line in self.log), pick_again)

    def _own(self, path: Path) -> None:
        if self.run_as:
            entry = pwd.getpwnam(self.run_as)
            os.chown(path, entry.pw_uid, entry.pw_gid)


@contextlib.contextmanager
def running_postgres(extra_listen: tuple[str, ...] = ()) -> Iterator[PostgresServer]:
    """A fresh PostgreSQL server on 127.0.0.1 with role and database ``stratalog``; stopped and removed
    when the block ends. ``extra_listen``: host ends of a test's private links (each a /30) it also
    serves, to clients on the other end."""
    bin_dir = find_bin_dir()
    run_as = None
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            raise PostgresUnavailableError(f"PostgreSQL will not run as root and there is no {SERVER_USER!r} "
                                           "user to run it as (Debian's postgresql package creates one)") from None
        run_as = SERVER_USER
    root = Path(tempfile.mkdtemp(prefix="stratalog-postgres-"))
    server = PostgresServer(bin_dir, root, free_port(), secrets.token_urlsafe(18), run_as,
                            extra_listen=extra_listen)
    try:
        server._own(root)
        server.init()
        server.start_on_a_free_port()
        server.create_database()
        yield server
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
