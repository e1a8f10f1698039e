"""Running one chaos child from the parent: start it, drain its stdout, SIGKILL it, reap it.

A thread reads the child's stdout from the start, so the child never blocks on a full pipe however fast
it reports, and watches for the lines a harness times its kill from. The child's stderr goes to a file
beside the harness's data and is quoted when the child fails. What the lines mean, and what counts as a
failure, stays with each harness.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO

from stratalog.chaos.lines import line_tag

#: Bytes per read of the child's stdout; its lines arrive at a few hundred KB/s up to about 1 MB/s.
READ_CHUNK_BYTES = 64 << 10
#: Last bytes of a failed child's stderr quoted in the error.
STDERR_TAIL_BYTES = 4000


class OutputReader(threading.Thread):
    """Drains a child's stdout (so the child never blocks on a full pipe) and spots the lines awaited.

    Each awaited tag has an event, set when a line with that tag arrives, or when stdout ends (``eof``
    is True by then). Once every awaited line has arrived, the reader only collects.
    """

    def __init__(self, stream: IO[bytes], awaited_tags: Iterable[str]) -> None:
        super().__init__(name="stratalog-chaos-reader", daemon=True)
        self._fd = stream.fileno()
        self.output = bytearray()
        self.arrived = {tag.encode(): threading.Event() for tag in awaited_tags}
        self.eof = False

    def run(self) -> None:
        waiting = set(self.arrived)
        scanned = 0
        while chunk := os.read(self._fd, READ_CHUNK_BYTES):
            self.output += chunk
            if not waiting:
                continue
            complete = self.output.rfind(b"\n") + 1
            for line in bytes(self.output[scanned:complete]).splitlines():
                tag = line_tag(line)
                if tag in waiting:
                    waiting.discard(tag)
                    self.arrived[tag].set()
            scanned = complete
        self.eof = True
        for event in self.arrived.values():
            event.set()


class ChildProcess:
    """A started child: its stdout collected by an :class:`OutputReader`, its stderr kept in a file."""

    def __init__(self, name: str, popen: subprocess.Popen[bytes], reader: OutputReader, stderr: IO[bytes]) -> None:
        self._name = name
        self._popen = popen
        self._reader = reader
        self._stderr = stderr

    @property
    def output(self) -> bytes:
        """Everything the child wrote to stdout so far: all of it once the child is reaped."""
        return bytes(self._reader.output)

    @property
    def eof(self) -> bool:
        return self._reader.eof

    @property
    def killed(self) -> bool:
        """The child ended by SIGKILL (rather than exiting by itself)."""
        return self._popen.returncode == -signal.SIGKILL

    def wait_for(self, tag: str, timeout_s: float) -> bool:
        """Wait until the child wrote a line tagged ``tag`` or closed its stdout; False after ``timeout_s``."""
        return self._reader.arrived[tag.encode()].wait(timeout_s)

    def kill_after(self, delay_s: float) -> float:
        """SIGKILL the child ``delay_s`` from now, reap it, and read the rest of its stdout.

        A child whose stdout already ended is not waited for, and one that exited by itself meanwhile is
        only reaped (see :attr:`killed`). Returns the seconds from this call to the kill.
        """
        since = time.monotonic()
        if not self._reader.eof:
            time.sleep(delay_s)
        if self._popen.poll() is None:
            self._popen.kill()  # SIGKILL
        killed_after_s = time.monotonic() - since
        self._popen.wait()
        self._reader.join()
        return killed_after_s

    def stop(self) -> None:
        """SIGKILL the child if it still runs, and reap it."""
        if self._popen.poll() is None:
            self._popen.kill()
            self._popen.wait()

    def failure(self, what: str) -> str:
        """Say that the child did ``what``, with its exit status and the tail of its stderr (stops it first)."""
        self.stop()
        self._stderr.seek(0)
        tail = self._stderr.read()[-STDERR_TAIL_BYTES:].decode(errors="replace")
        return f"the {self._name} chaos child {what} (exit status {self._popen.returncode}):\n{tail}"


@contextlib.contextmanager
def start_child(module: str, args: list[str], *, name: str, beside: Path,
                awaited_tags: Iterable[str]) -> Iterator[ChildProcess]:
    """Run ``python -m module args`` for the length of the ``with`` block; stop and reap it at the end.

    ``name`` names the child in failure messages. Its stderr goes to a file next to ``beside``, removed
    after a block that ends normally and kept after one that raises. ``awaited_tags`` are the tags
    :meth:`ChildProcess.wait_for` may wait for.
    """
    command = [sys.executable, "-m", module, *args]
    stderr_path = beside.with_name(beside.name + ".child-stderr")
    with (
        open(stderr_path, "w+b") as stderr,
        subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=stderr) as popen,
    ):
        assert popen.stdout is not None
        reader = OutputReader(popen.stdout, awaited_tags)
        reader.start()
        child = ChildProcess(name, popen, reader, stderr)
        try:
            yield child
        finally:
            child.stop()
            reader.join()
    stderr_path.unlink()
