"""Servers the harnesses start (PostgreSQL, SeaweedFS) die with them: a test run or a harness killed with
-9 leaves no server behind; a harness stopped by a signal at any point leaves no process of its own
(``no_child_left``) and none of the short commands it runs (``run_to_end``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path


def dying_with_parent(argv: Sequence[str], user: str | None = None) -> list[str]:
    """``argv`` run so that Linux kills it (SIGKILL) when the thread that started it dies
    (PR_SET_PDEATHSIG), as ``user`` if given. setpriv (util-linux) execs the command itself, so a kill of
    the started process is a kill of the server, and sets the signal after its change of user (which
    clears it). Without setpriv, and no user to change to, ``argv`` runs as it is."""
    as_user = [f"--reuid={user}", f"--regid={user}", "--init-groups"] if user else []
    if user or shutil.which("setpriv"):
        return ["setpriv", *as_user, "--pdeathsig", "KILL", "--", *argv]
    return list(argv)


def run_to_end(argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    """``argv`` run to its end in a process group of its own, its output captured as text. Interrupted
    (Ctrl-C, SIGTERM, the timeout), its whole group is killed and the command reaped before the exception
    goes on. ``subprocess.run`` kills only the one process (initdb's own children would live on) and after
    an interrupt waits for it at most 0.25 s (it would outlive the harness as a zombie of its group)."""
    with subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout_s)
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise
    return subprocess.CompletedProcess(list(argv), process.returncode, stdout, stderr)


def children() -> list[int]:
    """This process's child processes, running or exited and not yet reaped."""
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue   # gone meanwhile
            # After the command's name (in parentheses, which may hold anything): state, then the parent.
            if int(stat.rsplit(")", 1)[1].split()[1]) == me:
                found.append(int(entry.name))
    return found


@contextlib.contextmanager
def no_child_left() -> Iterator[None]:
    """When the block ends, however it ends, every child process started in it and still there is killed
    and reaped (those from before the block are left alone). Each owner stops what it started; this
    catches what an interrupt took from its owner's hands (a signal that came between a child's start and
    its owner's record of it)."""
    before = set(children())
    try:
        yield
    finally:
        for pid in set(children()) - before:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
