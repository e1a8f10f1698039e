"""A compaction pass's computing part (engine/cleaner_work.py) in a process of its own.

Why: a pass decodes every record in Python. In the broker's process that holds the interpreter lock in
turns of 5 ms against the event loop, and each Produce request waits for its turns: produce p99 was 2.3x
idle during a pass in `stratalog bench compaction`. A child process, started afresh (the broker has
threads: no fork; and no multiprocessing "spawn" either, which imports the parent's main script again, and
runs it where a script has no main guard) and niced, leaves the sharing of the cores to the operating
system, which favours the broker.

The child serves :class:`CleanWork`'s calls over a pipe, one at a time: a call is a pickled
``(name, args, has_payload)`` followed by its block's bytes, unpickled, when it has one; the answer a pickled
``("ok", result)`` or ``("error", exception)``, and for ``finish_piece`` the object's parts as raw messages
after it. The child ends when the pipe closes, so a broker killed with -9 leaves no cleaner behind. A child
that dies fails the pass (WorkerGoneError, a StratalogError: the broker tries again later) and the next pass
starts a new one.
"""

from __future__ import annotations

import logging
import os
import pickle
import socket
import subprocess
import sys
import threading
from multiprocessing.connection import Connection
from typing import Any

from stratalog.engine.cleaner_work import CleanWork, PassSettings, PieceOut
from stratalog.engine.objformat import BlockEntry
from stratalog.errors import StratalogError

log = logging.getLogger("stratalog.engine.cleaner")

#: The child's niceness, added to the broker's: under contention the broker's event loop gets the cores
#: first (19 is the lowest priority; 10 still lets a pass finish on a busy machine).
NICENESS_ADDED = 10
#: The module the child runs (its main guard calls :func:`serve`).
CHILD_MODULE = "stratalog.engine.cleaner_child"
#: How long a closing store waits for the child to end after its pipe closes, before killing it.
EXIT_WAIT_S = 5.0


class WorkerGoneError(StratalogError):
    """The cleaner's process died, or its pipe broke, during a call."""


class ProcessWork:
    """:class:`CleanWork`'s calls, answered by a child process started at the first call."""

    def __init__(self) -> None:
        self._conn: Connection | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def begin(self, settings: PassSettings) -> None:
        self._call("begin", (settings,))

    def map_block(self, block: bytes | memoryview, entry: BlockEntry) -> tuple[int, int]:
        result: tuple[int, int] = self._call("map_block", (entry,), block)
        return result

    def rewrite_block(self, block: bytes | memoryview, entry: BlockEntry) -> int:
        result: int = self._call("rewrite_block", (entry,), block)
        return result

    def finish_piece(self) -> PieceOut:
        with self._lock:
            conn = self._connection()
            head: PieceOut = self._exchange(conn, "finish_piece", (), None)
            try:
                parts: list[bytes | memoryview] = [conn.recv_bytes() for _ in head.parts]
            except (EOFError, OSError) as e:
                raise self._gone(e) from e
            return PieceOut(head.entries, parts, head.records_kept)

    def close(self) -> None:
        """End the child (it exits when its pipe closes)."""
        with self._lock:
            conn, process = self._conn, self._process
            self._conn = self._process = None
        if conn is not None:
            conn.close()
        if process is not None:
            try:
                process.wait(EXIT_WAIT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def _call(self, name: str, args: tuple[Any, ...], payload: bytes | memoryview | None = None) -> Any:
        with self._lock:
            return self._exchange(self._connection(), name, args, payload)

    def _exchange(self, conn: Connection, name: str, args: tuple[Any, ...],
                  payload: bytes | memoryview | None) -> Any:
        try:
            conn.send((name, args, payload is not None))
            if payload is not None:
                conn.send_bytes(payload)
            status, value = conn.recv()
        except (EOFError, OSError) as e:
            raise self._gone(e) from e
        if status == "error":
            raise value
        return value

    def _connection(self) -> Connection:
        if self._conn is None:
            ours, theirs = socket.socketpair()
            with ours, theirs:
                process = subprocess.Popen([sys.executable, "-m", CHILD_MODULE, str(theirs.fileno())],
                                           pass_fds=(theirs.fileno(),), stdin=subprocess.DEVNULL)
                self._conn, self._process = Connection(ours.detach()), process
            log.debug("cleaner process %d started", process.pid)
        return self._conn

    def _gone(self, cause: BaseException) -> WorkerGoneError:
        """Forget a broken child (the next call starts another) and say so."""
        process = self._process
        if self._conn is not None:
            self._conn.close()
        code = None
        if process is not None:
            if process.poll() is None:
                process.kill()
            code = process.wait()
        self._conn = self._process = None
        return WorkerGoneError(f"the cleaner's process ended (exit code {code}): {cause!r}")


def serve(conn: Connection) -> None:
    """The child: answer calls until the pipe closes."""
    os.nice(NICENESS_ADDED)
    work = CleanWork()
    while True:
        try:
            name, args, has_payload = conn.recv()
            if has_payload:
                args = (conn.recv_bytes(), *args)
        except (EOFError, OSError):
            return
        try:
            result = getattr(work, name)(*args)
        except Exception as e:   # every failure goes back to the pass that asked
            conn.send(("error", _picklable(e)))
            continue
        if isinstance(result, PieceOut):
            conn.send(("ok", PieceOut(result.entries, [b""] * len(result.parts), result.records_kept)))
            for part in result.parts:
                conn.send_bytes(part)
        else:
            conn.send(("ok", result))


def _picklable(e: Exception) -> Exception:
    """``e`` if it survives a round trip through pickle, else a StratalogError that names it."""
    try:
        pickle.loads(pickle.dumps(e))
    except Exception:   # any exception class that cannot cross the pipe
        return StratalogError(f"in the cleaner's process: {e!r}")
    return e
