"""`stratalog bench streams`: what many streams cost the stream store.

Creates N named streams in one call, appends one record to each (every append awaited), flushes them to
objects in one upload, reads one record back from a sample, closes, and opens the store again. Reports
the seconds of each step, the process's RSS growth per stream, and the bytes on disk per stream. The
reference is the same N rows put in a plain SQLite table in the same run (the floor of any store that
keeps one metadata row per stream).
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol

from stratalog.bench.common import disk_bytes, machine_info
from stratalog.engine.store import StreamStore

#: Appends in flight while touching every stream.
IN_FLIGHT_MAX = 10_000
#: Streams read back after the flush, spread evenly over all of them.
SAMPLE_STREAMS = 1000
RECORD = b"x" * 58  # the million-queue race's message size


class Progress(Protocol):
    def phase(self, description: str) -> None: ...

    def advance(self, fraction: float) -> None: ...


def rss_bytes() -> int:
    """The process's resident set now (not the peak): from /proc/self/statm."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def timed(step: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    result = step()
    return time.perf_counter() - started, result


def sqlite_reference(path: Path, names: list[str]) -> float:
    """Seconds to insert ``names`` as rows of a fresh SQLite table in one durable transaction."""
    db = sqlite3.connect(path, isolation_level=None)
    try:
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("CREATE TABLE streams (stream_id INTEGER PRIMARY KEY, name TEXT UNIQUE, created_ms INTEGER)")
        started = time.perf_counter()
        db.execute("BEGIN")
        db.executemany("INSERT INTO streams (name, created_ms) VALUES (?, 0)", ((n,) for n in names))
        db.execute("COMMIT")
        return time.perf_counter() - started
    finally:
        db.close()


def append_to_all(store: StreamStore, names: list[str], progress: Progress) -> None:
    window: deque[Future[int]] = deque()
    for i, name in enumerate(names):
        if len(window) >= IN_FLIGHT_MAX:
            window.popleft().result()
            if i % IN_FLIGHT_MAX == 0:
                progress.advance(i / len(names))
        window.append(store.open_stream(name).append([RECORD]))
    while window:
        window.popleft().result()


def read_sample(store: StreamStore, names: list[str]) -> int:
    step = max(1, len(names) // SAMPLE_STREAMS)
    for name in names[::step]:
        got = store.open_stream(name).fetch(0)
        if [r.value for r in got] != [RECORD]:
            raise RuntimeError(f"stream {name} read back {len(got)} records, not the one appended")
    return len(names[::step])


def reopen_in_child(data_dir: Path) -> dict[str, Any]:
    """Open the store in a fresh interpreter: its time, and its RSS before and after the open."""
    code = ("import gc, json, sys, time; from stratalog.bench.streams import rss_bytes; "
            "from stratalog.engine.store import StreamStore; before = rss_bytes(); t = time.perf_counter(); "
            "s = StreamStore.open(sys.argv[1]); took = time.perf_counter() - t; after = rss_bytes(); "
            "t = time.perf_counter(); gc.collect(); gc_s = time.perf_counter() - t; tracked = len(gc.get_objects()); "
            "gc.freeze(); t = time.perf_counter(); gc.collect(); frozen_s = time.perf_counter() - t; s.close(); "
            "print(json.dumps({'reopen_s': took, 'rss_before': before, 'rss_after': after, 'gc_full_s': gc_s, "
            "'gc_tracked_objects': tracked, 'gc_full_after_freeze_s': frozen_s}))")
    done = subprocess.run([sys.executable, "-c", code, str(data_dir)], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"reopening the store in a child process failed: {done.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def run_streams_bench(dir_path: Path, streams: int, progress: Progress) -> dict[str, Any]:
    names = [f"stream-{i:08d}" for i in range(streams)]
    data_dir = dir_path / "store"
    rss_start = rss_bytes()
    steps: dict[str, float] = {}
    progress.phase(f"creating {streams:,} streams in one call")
    store = StreamStore.open(data_dir)
    steps["create_s"], _ = timed(lambda: store.create_streams(names))
    rss_created = rss_bytes()
    progress.phase(f"appending one record to each of {streams:,} streams")
    steps["append_s"], _ = timed(lambda: append_to_all(store, names, progress))
    progress.phase("flushing every stream to objects")
    steps["flush_s"], _ = timed(store.flush)
    rss_flushed = rss_bytes()
    progress.phase(f"reading back {min(streams, SAMPLE_STREAMS):,} streams")
    steps["read_sample_s"], sampled = timed(lambda: read_sample(store, names))
    steps["close_s"], _ = timed(store.close)
    progress.phase("opening the store again, in a fresh process")
    reopened = reopen_in_child(data_dir)
    steps["reopen_s"] = reopened["reopen_s"]
    on_disk = disk_bytes(data_dir)
    wal_bytes = disk_bytes(data_dir / "wal")
    progress.phase("reference: the same names as rows of a plain SQLite table")
    reference_s = sqlite_reference(dir_path / "reference.sqlite", names)
    return {
        "bench": "streams",
        "streams": streams,
        "record_bytes": len(RECORD),
        "machine": machine_info(dir_path),
        "seconds": steps,
        "streams_per_s": {"create": streams / steps["create_s"], "append": streams / steps["append_s"],
                          "flush": streams / steps["flush_s"], "reopen": streams / steps["reopen_s"]},
        "sampled_streams": sampled,
        "rss_bytes": {"start": rss_start, "created": rss_created, "flushed": rss_flushed,
                      "reopen_child_before": reopened["rss_before"], "reopen_child_after": reopened["rss_after"]},
        # Growth of this process while creating (names and handles included), and of a fresh process
        # that only opens the store: the steady cost of a stream.
        "rss_bytes_per_stream": {"created": (rss_created - rss_start) / streams,
                                 "reopened": (reopened["rss_after"] - reopened["rss_before"]) / streams},
        # A full garbage collection walks every tracked object, so every stream's state: the pause it
        # costs with the store open, and after gc.freeze() (the state moved out of the collector's way).
        "gc": {"full_collection_ms": reopened["gc_full_s"] * 1000, "tracked_objects": reopened["gc_tracked_objects"],
               "full_collection_after_freeze_ms": reopened["gc_full_after_freeze_s"] * 1000},
        "disk_bytes": on_disk,
        "disk_bytes_per_stream_without_wal": (on_disk - wal_bytes) / streams,
        "reference": {"sqlite_insert_s": reference_s, "create_over_sqlite": steps["create_s"] / reference_s},
    }
