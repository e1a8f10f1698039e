"""A real `stratalog serve` as a child process on 127.0.0.1, for the tests and the broker chaos harness:
started on a given or ephemeral port, ready once it says where it listens, stopped by its owner."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from stratalog.broker.stack_dump import DUMP_END

_LISTENING = re.compile(r"listening on ([0-9.]+):(\d+)")
#: One line per listener: "listening on HOST:PORT (PROTOCOL; ...".
_LISTENER = re.compile(r"listening on ([0-9.]+:\d+) \((\w+)")
#: How long a broker may take to open its store and listen (a loaded CI machine, a large WAL to replay).
START_TIMEOUT_S = 60.0
#: What `serve` says when its port is taken (a fixed port picked free, then taken by another process of a
#: busy machine before the broker bound it).
PORT_TAKEN = "address already in use"
#: How long a broker may take to print its stacks (stack_dump.py) once asked: its loop may be busy.
STACKS_WAIT_S_MAX = 30.0


class PortTakenError(RuntimeError):
    """The broker did not start: its port was taken."""


@dataclass
class BrokerProcess:
    process: subprocess.Popen[str]
    host: str
    port: int
    data_dir: Path
    output: list[str] = field(default_factory=list)
    #: The thread copying the broker's stdout into ``output``; it ends when the process does.
    pump: threading.Thread | None = None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def listeners(self) -> dict[str, str]:
        """Every listener's ``HOST:PORT``, by security protocol (PLAINTEXT, SASL_SSL, ...)."""
        return {m.group(2): m.group(1) for line in self.output if (m := _LISTENER.search(line))}

    def kill9(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> int:
        """SIGTERM and wait: the broker's clean stop."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=60)

    def stacks(self, wait_s_max: float = STACKS_WAIT_S_MAX) -> str:
        """What every thread and task of the broker is doing (SIGUSR1; broker/stack_dump.py), for a
        failure's message; what it printed so far if it does not finish within ``wait_s_max``."""
        start = len(self.output)
        if self.process.poll() is not None:
            return f"(exited with status {self.process.returncode})"
        self.process.send_signal(signal.SIGUSR1)
        deadline = time.monotonic() + wait_s_max
        while not any(line.startswith(DUMP_END) for line in self.output[start:]):
            if time.monotonic() > deadline or self.process.poll() is not None:
                break
            time.sleep(0.05)
        return "".join(self.output[start:])

    def close_output(self) -> None:
        """Once the process has ended: let the pump read to the end, then close the pipe."""
        if self.pump is not None:
            self.pump.join(timeout=30)
        if self.process.stdout is not None:
            self.process.stdout.close()


def start_broker(data_dir: Path, *extra: str, port: int = 0, host: str = "127.0.0.1",
                 launcher: Sequence[str] = (), verbose: bool = False) -> BrokerProcess:
    """Start `stratalog serve` on ``host`` and return once it listens (it says where on stdout).
    ``launcher`` runs it (``ip netns exec NAME``: in a test's network namespace); ``verbose``: info
    lines too (what it leads, hands over, replays)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    process = subprocess.Popen(
        [*launcher, sys.executable, "-c", "from stratalog.cli import main; main()", *(["-v"] if verbose else []),
         "serve", "--data-dir", str(data_dir), "--listen", f"{host}:{port}", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    assert process.stdout is not None
    output: list[str] = []
    found: list[tuple[str, int]] = []
    ready = threading.Event()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            output.append(line)
            match = _LISTENING.search(line)
            if match and not found:
                found.append((match.group(1), int(match.group(2))))
            if found and "bootstrap servers" in line:  # printed after every listener's line
                ready.set()
        process.stdout.close()  # at EOF: the child is gone
        ready.set()

    pump_thread = threading.Thread(target=pump, daemon=True)
    pump_thread.start()
    try:
        started = ready.wait(START_TIMEOUT_S) and bool(found)
    except BaseException:   # interrupted (Ctrl-C, SIGTERM) while it starts: it must not outlive its owner
        started = False
        raise
    finally:
        if not started:
            process.kill()
            process.wait(timeout=30)
            pump_thread.join(timeout=30)
            process.stdout.close()
    if not started:
        said = "".join(output)
        error = PortTakenError if PORT_TAKEN in said else RuntimeError
        raise error("the broker did not start:\n" + said)
    host, bound = found[0]
    return BrokerProcess(process, host, bound, data_dir, output, pump_thread)


@contextmanager
def running_broker(data_dir: Path, *extra: str) -> Iterator[BrokerProcess]:
    broker = start_broker(data_dir, *extra)
    try:
        yield broker
    finally:
        if broker.process.poll() is None:
            broker.process.kill()
            broker.process.wait(timeout=30)
        broker.close_output()
