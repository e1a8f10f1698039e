"""The harnesses' process hygiene: a short command interrupted leaves nothing of its process group, and a
block under ``no_child_left`` leaves no child it started, running or exited."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from stratalog.chaos.launch import children, no_child_left, run_to_end
from waiting import wait_until


def _running(argv: list[str]) -> list[int]:
    """Processes whose command line is ``argv`` (an exited one's is empty)."""
    marker = b"\0".join(arg.encode() for arg in argv) + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes() == marker:
                    found.append(int(entry.name))
            except OSError:
                pass   # gone meanwhile
    return found


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def test_a_command_runs_to_its_end_with_its_output() -> None:
    done = run_to_end([sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)"],
                      timeout_s=60)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out\n", "err\n")


def test_an_interrupted_command_leaves_no_process_of_its_group() -> None:
    grandchild = ["sleep", f"3600.{secrets.randbelow(10**6):06d}"]   # this test's alone
    before = set(children())
    previous = signal.signal(signal.SIGUSR1, _interrupt)

    def interrupt_once_the_grandchild_runs() -> None:
        wait_until(lambda: _running(grandchild), "the command's own child")
        os.kill(os.getpid(), signal.SIGUSR1)

    thread = threading.Thread(target=interrupt_once_the_grandchild_runs, daemon=True)
    thread.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_to_end(["sh", "-c", f"{' '.join(grandchild)} & wait"], timeout_s=3600)
    finally:
        thread.join()
        signal.signal(signal.SIGUSR1, previous)
    left = set(children()) - before
    assert not left, [(pid, Path(f'/proc/{pid}/cmdline').read_bytes(), _state(pid)) for pid in left]
    wait_until(lambda: not _running(grandchild), "its child killed too")


def test_a_timed_out_command_is_killed_and_reaped() -> None:
    before = set(children())
    with pytest.raises(subprocess.TimeoutExpired):
        run_to_end(["sleep", "3600"], timeout_s=0.01)
    assert set(children()) == before


def test_no_child_started_in_the_block_outlives_it() -> None:
    older = subprocess.Popen(["sleep", "3600"])
    before = set(children())   # with the older one, and whatever else this worker runs
    started: list[subprocess.Popen[bytes]] = []
    try:
        with no_child_left():
            started.append(subprocess.Popen(["sleep", "3600"]))
            started.append(exited := subprocess.Popen(["true"]))
            wait_until(lambda: _state(exited.pid) == "Z", "the short one exited")
        assert set(children()) - before == set()   # the two started in the block are gone, reaped
        assert older.pid in children() and older.poll() is None   # one from before is left alone
    finally:
        for process in started:
            process.wait()   # reaped already: Popen learns it (its status is lost)
        older.kill()
        older.wait()


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
