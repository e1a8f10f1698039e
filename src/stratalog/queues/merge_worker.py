"""Merges of run objects in a worker process of their own.

A merge is bulk work (read the sources' pages, check them, gather the runs, write the pieces, compute the new
pages' CRCs) but much of it holds the GIL a little at a time: beside a writer and busy producer threads a
merge made in a thread got the GIL a few milliseconds at a time, and either fell behind or, holding the
upload lock to keep up, stopped the uploads and with them the producers (at a million queues, a send
with no merges at all was much faster). A worker process has a GIL and a core of its own.

The store hands the worker a :class:`MergeJob` (the local object store's directory, the source objects and
the keys of the pieces to write) as its stdin (a temporary file) and reads back, on its stdout, each piece's
:class:`~stratalog.queues.compaction.MergeResult`, or the error that stopped the merge. The worker plans
the merge itself from the sources (the same plan the store made: it is a function of the sources). It
writes only objects the store has not committed: if either side dies, the pieces are orphans, deleted
when the store next opens. The worker dies with the thread that started it (``PR_SET_PDEATHSIG``), so a
store killed with -9 leaves no merge writing behind it.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

import stratalog
from stratalog.errors import OutOfSpaceError
from stratalog.io import libc
from stratalog.objects.local import LocalDirStore
from stratalog.objects.store import ObjectStoreError, ObjectStoreFullError, put_parts
from stratalog.queues.compaction import MergeResult, MergeSource, merge_piece, plan_merge
from stratalog.queues.format import CorruptBulkError, U32s

#: How often a store waiting for its worker checks whether it is closing.
POLL_S = 0.2


class MergeWorkerError(ObjectStoreError):
    """The merge worker failed, or exited without an answer (safe to retry: it committed nothing)."""


class MergeWorkerFullError(MergeWorkerError, ObjectStoreFullError):
    """The merge worker's output did not fit: the disk is full."""


class MergeCancelledError(Exception):
    """The store closed while its worker merged: the worker was stopped."""


@dataclasses.dataclass(frozen=True, slots=True)
class MergeJob:
    root: str                            # the LocalDirStore's directory
    sources: tuple[tuple[str, int], ...]  # (key, size in bytes) of each object to merge, in order
    prev_ends: U32s
    piece_keys: tuple[str, ...]          # one key per piece of the plan
    piece_bytes_max: int
    slice_bytes: int
    sync_every_bytes: int


@dataclasses.dataclass(frozen=True, slots=True)
class MergeAnswer:
    results: list[MergeResult]   # each piece's, in order
    peak_rss_bytes: int          # the worker's own peak resident memory


def run_merge_job(job: MergeJob, cancelled: Callable[[], bool]) -> MergeAnswer:
    """Run ``job`` in a worker process; its pieces' MergeResults and the worker's peak RSS. Raises
    MergeCancelledError when ``cancelled()`` turns true meanwhile (the worker is killed), CorruptBulkError
    when a source failed its checks, MergeWorkerError for anything else."""
    package_root = str(Path(stratalog.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    # The job goes in a file rather than a pipe: communicate() with a timeout stops sending its input once
    # the first wait times out, and a job (the end offsets of every queue) is megabytes.
    with tempfile.TemporaryFile() as job_file:
        job_file.write(pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL))
        job_file.seek(0)
        with subprocess.Popen([sys.executable, "-m", "stratalog.queues.merge_worker", str(os.getpid())],
                              stdin=job_file, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                              close_fds=True) as proc:
            try:
                while True:
                    try:
                        out, err = proc.communicate(timeout=POLL_S)
                        break
                    except subprocess.TimeoutExpired:
                        if cancelled():
                            raise MergeCancelledError from None
            finally:
                if proc.poll() is None:
                    proc.kill()
    try:
        answer = pickle.loads(out) if out else None
    except Exception:
        answer = None
    if not isinstance(answer, tuple) or not answer:
        tail = err.decode(errors="replace").strip().splitlines()[-3:]
        raise MergeWorkerError(f"the merge worker exited with status {proc.returncode} without an answer"
                               + (f": {' / '.join(tail)}" if tail else ""))
    if answer[0] == "ok":
        return MergeAnswer(answer[1], answer[2])
    kind, message = answer[1], answer[2]
    if kind == "corrupt":
        raise CorruptBulkError(message)
    if kind == "full":
        raise MergeWorkerFullError(message)
    raise MergeWorkerError(message)


def _die_with_parent(parent: int) -> None:
    libc.die_with_parent()
    if os.getppid() != parent:      # the parent was gone before the signal was set up
        os._exit(1)


def _work(job: MergeJob) -> list[MergeResult]:
    store = LocalDirStore(Path(job.root))
    sources = []
    for key, size in job.sources:
        reader = store.open_reader(key)
        # The index is read into bytes of its own (the source keeps views of it); the runs straight into the
        # buffer each slice is gathered from.
        sources.append(dataclasses.replace(MergeSource.open(key, reader.read, size), read_into=reader.read_into))
    plan = plan_merge(sources, np.asarray(job.prev_ends), job.piece_bytes_max)
    if len(plan.pieces) != len(job.piece_keys):
        raise MergeWorkerError(f"the worker planned {len(plan.pieces)} pieces, the store {len(job.piece_keys)}")
    results = []
    for piece, key in enumerate(job.piece_keys):
        result = MergeResult()
        put_parts(store, key, merge_piece(plan, piece, job.slice_bytes, result),
                  sync_every_bytes=job.sync_every_bytes, size_hint=plan.piece_runs_bytes(piece))
        results.append(result)
    return results


def _peak_rss_bytes() -> int:
    """This process's peak resident memory since it started. Not getrusage: its ru_maxrss carries over the
    parent's across the fork and exec that started the worker."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    _die_with_parent(int(sys.argv[1]))
    job = pickle.loads(sys.stdin.buffer.read())
    try:
        results = _work(job)
        answer: tuple[object, ...] = ("ok", results, _peak_rss_bytes())
    except CorruptBulkError as e:
        answer = ("error", "corrupt", str(e))
    except OutOfSpaceError as e:
        answer = ("error", "full", str(e))
    except Exception as e:
        answer = ("error", type(e).__name__, f"{type(e).__name__}: {e}")
    sys.stdout.buffer.write(pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL))
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()
