"""`stratalog bench log`: the "Benchmarking Commit Logs" tests (Kafka vs NATS Streaming), on a StreamStore.

Latency: for each record size, one record per ``Stream.append`` at a fixed rate (50/s for 30 s in the
original), paced by absolute deadlines (record ``i`` is due at ``start + i / rate``), so a slow append
never shifts the schedule of the ones after it. A record's latency is the time from calling ``append``
to its future completing (the future completes once the record is durable under the fsync policy).
Right after the 256 B run, the same pattern is timed on the bare disk: one 4 KiB O_DIRECT + O_DSYNC
write per record to a file in the same directory. That is the floor for a durable append of one record.

Throughput: N records of each size, one record per append, every append acknowledged. The producer
keeps at most ``in_flight_max`` appends outstanding (it waits for the oldest future when the window is
full) and the run ends when the last future has completed: records/s is N over that time. The
one-at-a-time rate (append, wait for its future, repeat) is measured after it, for a bounded time.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from stratalog.bench.common import KIB_BYTES, MIB_BYTES, MS_PER_S, Activity, machine_info, size_label
from stratalog.engine.config import StoreConfig
from stratalog.engine.store import Stream, StreamStore
from stratalog.io.device import FileDevice, aligned_buffer
from stratalog.wal.config import FsyncPolicy

#: The original's record sizes, rate and run length.
SIZES_BYTES_DEFAULT = (256, KIB_BYTES, 5 * KIB_BYTES, MIB_BYTES)
RATE_PER_S_DEFAULT = 50.0
#: The original's throughput test: 100,000 records of each size ...
THROUGHPUT_RECORDS_DEFAULT = 100_000
#: ... but never more than this many bytes per size: 100,000 records of 1 MiB would be 98 GiB written
#: twice (WAL and objects). The record count actually used is in every result.
THROUGHPUT_BYTES_MAX_DEFAULT = 2 << 30
#: Appends outstanding at once in the throughput run (as an asynchronous publisher with a bounded
#: number of unacknowledged messages). 1000: enough to keep every WAL I/O thread busy at any size.
IN_FLIGHT_MAX_DEFAULT = 1000
#: The one-at-a-time rate runs at most this long per size (at a few ms per durable append, 100,000
#: records would take minutes).
SYNC_SECONDS_DEFAULT = 5.0
#: Records appended and awaited before each timed run, not counted: the first append of a run pays
#: for starting threads and faulting in buffers, which is not what a steady producer sees.
WARMUP_RECORDS = 20
#: The reference writes one 4 KiB page per record (the WAL's alignment: the smallest durable write),
#: cycling over a file of this size so no write extends the file.
REFERENCE_WRITE_BYTES = 4 << 10
REFERENCE_FILE_BYTES = 4 << 20
#: A future not completed after this long means the store is stuck, not slow: the run fails.
FUTURE_WAIT_S_MAX = 120.0
#: How often a run tells the progress display how far it has come.
PROGRESS_EVERY_S = 0.25
#: Percentiles reported, as (JSON key, percentile).
PERCENTILES = (("p50", 50.0), ("p90", 90.0), ("p99", 99.0), ("p99_9", 99.9), ("p99_99", 99.99))

#: Target: p99 of 256 B appends at 50/s with fsync=always. NATS Streaming with fsync measured 21.7 ms in
#: the original, Kafka without fsync 0.92 ms.
TARGET_RECORD_BYTES = 256
TARGET_LATENCY_MS_P99_MAX = 1.0


class Progress(Protocol):
    """Where a benchmark says what it is doing; the command shows it as a progress bar."""

    def phase(self, description: str) -> None:
        """A new phase starts."""

    def advance(self, fraction: float) -> None:
        """The current phase is ``fraction`` (0..1) done."""


class BenchFailedError(RuntimeError):
    """An append failed or never completed: the store stopped, so no figure means anything."""


@dataclass(frozen=True, slots=True)
class LogBenchPlan:
    """Everything one `bench log` run does, resolved from the command line."""

    sizes_bytes: tuple[int, ...]
    rate_per_s: float
    seconds: float
    throughput_records: int
    throughput_bytes_max: int
    in_flight_max: int
    sync_seconds: float
    dir_path: Path
    fsync: FsyncPolicy

    def store_config(self) -> StoreConfig:
        base = StoreConfig()
        return replace(base, wal=replace(base.wal, fsync=self.fsync))

    def throughput_records_for(self, record_bytes: int) -> int:
        return max(1, min(self.throughput_records, self.throughput_bytes_max // record_bytes))


# Latency summaries -------------------------------------------------------------------------------------


def latency_summary_ms(latencies_s: npt.NDArray[np.float64]) -> dict[str, float]:
    """p50 .. p99.99, max and mean of ``latencies_s``, in ms. A percentile needs about 1 / (1 - p)
    samples to mean more than "the max": the sample count is kept beside them."""
    if latencies_s.size == 0:
        return {**{key: 0.0 for key, _ in PERCENTILES}, "max": 0.0, "avg": 0.0, "samples": 0}
    latencies_ms = latencies_s * MS_PER_S
    points = np.percentile(latencies_ms, [pct for _, pct in PERCENTILES])
    summary = {key: float(value) for (key, _), value in zip(PERCENTILES, points, strict=True)}
    summary["max"] = float(latencies_ms.max())
    summary["avg"] = float(latencies_ms.mean())
    summary["samples"] = int(latencies_ms.size)
    return summary


def target(name: str, figure: float, bound: float, *, at_least: bool, applies: bool = True,
           why_not: str = "") -> dict[str, Any]:
    """A target with its verdict; ``applies`` False when the run's conditions are not the target's."""
    met = figure >= bound if at_least else figure <= bound
    return {"name": name, "figure": figure, "bound": bound, "at_least": at_least, "met": met,
            "applies": applies, "why_not": why_not}


# Completion times ------------------------------------------------------------------------------------


class Completions:
    """Completion times of up to ``capacity`` futures, by index, set by done-callbacks on the store's
    threads.

    A future's waiters wake before its callbacks run, so ``wait_all`` waits for the callbacks
    themselves, not for the futures.
    """

    def __init__(self, capacity: int) -> None:
        self.done_s = np.full(capacity, np.nan)
        self.error: BaseException | None = None
        self._completed = 0
        self._cond = threading.Condition()

    def watch(self, index: int, future: Future[int]) -> None:
        future.add_done_callback(lambda f: self._on_done(index, f))

    def _on_done(self, index: int, future: Future[int]) -> None:
        done_s = time.perf_counter()
        error = future.exception()
        with self._cond:
            if error is not None and self.error is None:
                self.error = error
            self.done_s[index] = done_s
            self._completed += 1
            self._cond.notify_all()

    def wait_all(self, count: int, what: str) -> None:
        """Return once ``count`` futures have completed; raise if one failed or they never did."""
        with self._cond:
            finished = self._cond.wait_for(lambda: self._completed >= count or self.error is not None,
                                           timeout=FUTURE_WAIT_S_MAX)
        if self.error is not None:
            raise BenchFailedError(f"an append failed during {what}: {self.error}") from self.error
        if not finished:
            raise BenchFailedError(f"appends of {what} were not durable after {FUTURE_WAIT_S_MAX} s")


# Paced runs ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PacedRun:
    """One paced run: when each operation was due, started and completed (perf_counter seconds)."""

    due_s: npt.NDArray[np.float64]
    started_s: npt.NDArray[np.float64]
    done_s: npt.NDArray[np.float64]

    @property
    def latencies_s(self) -> npt.NDArray[np.float64]:
        return self.done_s - self.started_s

    def summary(self) -> dict[str, Any]:
        lag_s = self.started_s - self.due_s
        return {
            "count": int(self.due_s.size),
            "latency_ms": latency_summary_ms(self.latencies_s),
            # From the due time: the same plus any delay in starting it (a pacing check; at 50/s
            # the previous operation is long finished, so this should be the latency plus sleep jitter).
            "latency_from_due_ms": latency_summary_ms(self.done_s - self.due_s),
            "start_lag_ms_max": float(lag_s.max() * MS_PER_S) if lag_s.size else 0.0,
        }


def pace(count: int, rate_per_s: float, operation: Callable[[int], None], progress: Progress) -> PacedRun:
    """Call ``operation(i)`` for i in 0..count-1, the i-th at ``start + i / rate_per_s`` or as soon after
    as possible; returns due and start times (the operation records its own completion)."""
    interval_s = 1.0 / rate_per_s
    due_s = np.empty(count)
    started_s = np.empty(count)
    clock = time.perf_counter
    first_s = clock() + interval_s
    next_progress_s = 0.0
    for i in range(count):
        due = first_s + i * interval_s
        now = clock()
        if now < due:
            time.sleep(due - now)
        due_s[i] = due
        started_s[i] = clock()
        operation(i)
        if started_s[i] >= next_progress_s:
            progress.advance(i / count)
            next_progress_s = started_s[i] + PROGRESS_EVERY_S
    return PacedRun(due_s, started_s, np.empty(0))


def _warm_up(stream: Stream, payload: bytes) -> None:
    for _ in range(WARMUP_RECORDS):
        stream.append([payload]).result(timeout=FUTURE_WAIT_S_MAX)


def run_latency(stream: Stream, payload: bytes, plan: LogBenchPlan, progress: Progress) -> PacedRun:
    """One record per append at ``plan.rate_per_s`` for ``plan.seconds``; latency append -> durable."""
    count = max(1, round(plan.rate_per_s * plan.seconds))
    _warm_up(stream, payload)
    completions = Completions(count)
    append = stream.append
    records = [payload]

    def append_one(i: int) -> None:
        completions.watch(i, append(records))

    run = pace(count, plan.rate_per_s, append_one, progress)
    completions.wait_all(count, f"the {size_label(len(payload))} latency run")
    return replace(run, done_s=completions.done_s)


def run_reference(path: Path, plan: LogBenchPlan, progress: Progress) -> PacedRun:
    """The latency pattern on the bare disk: one 4 KiB O_DIRECT + O_DSYNC write per record."""
    return disk_reference(path, plan.rate_per_s, plan.seconds, progress)


def disk_reference(path: Path, rate_per_s: float, seconds: float, progress: Progress) -> PacedRun:
    """One 4 KiB O_DIRECT + O_DSYNC write per record at ``rate_per_s`` for ``seconds``, to a file at
    ``path`` (removed after): what one durable write costs this disk, the floor of any durable append."""
    count = max(1, round(rate_per_s * seconds))
    device = FileDevice.open(path, size_bytes=REFERENCE_FILE_BYTES, create=True, sync_writes=True)
    buf = aligned_buffer(REFERENCE_WRITE_BYTES)
    buf.write(os.urandom(REFERENCE_WRITE_BYTES))  # not zeros: a disk that compresses must not gain
    slots = REFERENCE_FILE_BYTES // REFERENCE_WRITE_BYTES
    done_s = np.empty(count)
    try:
        if not device.durable_writes:
            raise BenchFailedError(f"{path.parent} refuses O_DIRECT (tmpfs?): the reference needs a real "
                                   "disk; put the bench's directory on one")
        for i in range(WARMUP_RECORDS):
            device.pwrite(buf, i % slots * REFERENCE_WRITE_BYTES)

        def write_one(i: int) -> None:
            device.pwrite(buf, i % slots * REFERENCE_WRITE_BYTES)
            done_s[i] = time.perf_counter()

        run = pace(count, rate_per_s, write_one, progress)
    finally:
        buf.close()
        device.close()
        path.unlink(missing_ok=True)
    return replace(run, done_s=done_s)


# Throughput ------------------------------------------------------------------------------------------


def run_throughput(stream: Stream, payload: bytes, records: int, in_flight_max: int,
                   progress: Progress) -> dict[str, Any]:
    """``records`` appends of one record each, at most ``in_flight_max`` outstanding; every one awaited."""
    _warm_up(stream, payload)
    window: deque[Future[int]] = deque()
    append = stream.append
    batch = [payload]
    clock = time.perf_counter
    started_s = clock()
    next_progress_s = started_s
    for i in range(records):
        if len(window) >= in_flight_max:
            window.popleft().result(timeout=FUTURE_WAIT_S_MAX)  # futures complete in append order
            now = clock()
            if now >= next_progress_s:
                progress.advance(i / records)
                next_progress_s = now + PROGRESS_EVERY_S
        window.append(append(batch))
    while window:
        window.popleft().result(timeout=FUTURE_WAIT_S_MAX)
    seconds = clock() - started_s
    return _rate(records, len(payload), seconds)


def run_sync(stream: Stream, payload: bytes, records_max: int, seconds_max: float,
             progress: Progress) -> dict[str, Any]:
    """Append one record, wait for it, repeat: for ``seconds_max`` or ``records_max`` records."""
    append = stream.append
    batch = [payload]
    clock = time.perf_counter
    started_s = clock()
    deadline_s = started_s + seconds_max
    next_progress_s = started_s
    records = 0
    now = started_s
    while records < records_max and now < deadline_s:
        append(batch).result(timeout=FUTURE_WAIT_S_MAX)
        records += 1
        now = clock()
        if now >= next_progress_s:
            progress.advance((now - started_s) / seconds_max)
            next_progress_s = now + PROGRESS_EVERY_S
    return _rate(records, len(payload), now - started_s)


def _rate(records: int, record_bytes: int, seconds: float) -> dict[str, Any]:
    return {
        "records": records,
        "seconds": seconds,
        "records_per_s": records / seconds if seconds else 0.0,
        "mib_per_s": records * record_bytes / MIB_BYTES / seconds if seconds else 0.0,
    }


# The whole run ---------------------------------------------------------------------------------------


def phase_count(plan: LogBenchPlan) -> int:
    """Progress-bar phases: per size latency, windowed and one-at-a-time throughput; one reference."""
    return 3 * len(plan.sizes_bytes) + 1


def _latency_results(store: StreamStore, plan: LogBenchPlan, ref_path: Path,
                     progress: Progress) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    results = []
    reference: dict[str, Any] | None = None
    for size in plan.sizes_bytes:
        label = size_label(size)
        progress.phase(f"latency: {label} records, {plan.rate_per_s:g}/s for {plan.seconds:g} s")
        stream = store.create_stream(f"latency-{size}")
        run = run_latency(stream, os.urandom(size), plan, progress)
        store.flush()  # the next run starts with nothing waiting for upload
        results.append({"record_bytes": size, "rate_per_s": plan.rate_per_s, "seconds": plan.seconds,
                        **run.summary()})
        if size == TARGET_RECORD_BYTES:
            progress.phase(f"reference: one {REFERENCE_WRITE_BYTES >> 10} KiB O_DIRECT+O_DSYNC write per "
                           f"record, {plan.rate_per_s:g}/s")
            reference = {"write_bytes": REFERENCE_WRITE_BYTES, "sync": "O_DIRECT + O_DSYNC",
                         "rate_per_s": plan.rate_per_s, "seconds": plan.seconds,
                         **run_reference(ref_path, plan, progress).summary()}
    return results, reference


def _throughput_results(store: StreamStore, plan: LogBenchPlan, progress: Progress) -> list[dict[str, Any]]:
    results = []
    for size in plan.sizes_bytes:
        label = size_label(size)
        records = plan.throughput_records_for(size)
        payload = os.urandom(size)
        progress.phase(f"throughput: {records:,} x {label}, up to {plan.in_flight_max} in flight")
        windowed = run_throughput(store.create_stream(f"throughput-{size}"), payload, records,
                                  plan.in_flight_max, progress)
        store.flush()
        progress.phase(f"throughput: {label}, one at a time")
        one = run_sync(store.create_stream(f"sync-{size}"), payload, records, plan.sync_seconds, progress)
        store.flush()
        results.append({"record_bytes": size, "in_flight_max": plan.in_flight_max, **windowed,
                        "one_at_a_time": one})
    return results


def _targets(plan: LogBenchPlan, latency: list[dict[str, Any]],
             reference: dict[str, Any] | None) -> list[dict[str, Any]]:
    found = [r for r in latency if r["record_bytes"] == TARGET_RECORD_BYTES]
    if not found:
        return []
    applies = plan.fsync is FsyncPolicy.ALWAYS and plan.rate_per_s == RATE_PER_S_DEFAULT
    why_not = "" if applies else (f"the target is for fsync=always at {RATE_PER_S_DEFAULT:g}/s; this run: "
                                  f"fsync={plan.fsync.value} at {plan.rate_per_s:g}/s")
    figure = found[0]["latency_ms"]["p99"]
    result = target("256 B p99 ms", figure, TARGET_LATENCY_MS_P99_MAX, at_least=False, applies=applies,
                    why_not=why_not)
    if reference is not None and reference["latency_ms"]["p99"] > 0:
        result["reference_p99_ms"] = reference["latency_ms"]["p99"]
        result["ratio_to_reference"] = figure / reference["latency_ms"]["p99"]
    return [result]


def run_log_bench(plan: LogBenchPlan, progress: Progress) -> dict[str, Any]:
    """Run every phase of the plan; return the JSON document. Leaves no file behind."""
    load_start = os.getloadavg()
    machine = machine_info(plan.dir_path)
    activity_start = Activity.take(machine["disk_device"])
    tag = uuid.uuid4().hex[:8]
    store_dir = plan.dir_path / f"bench-log-{tag}"
    ref_path = plan.dir_path / f"bench-log-{tag}.ref"
    started = time.time()
    try:
        with StreamStore.open(store_dir, config=plan.store_config()) as store:
            latency, reference = _latency_results(store, plan, ref_path, progress)
            throughput = _throughput_results(store, plan, progress)
    finally:
        shutil.rmtree(store_dir, ignore_errors=True)
        ref_path.unlink(missing_ok=True)
    return {
        "bench": "log",
        "fsync": plan.fsync.value,
        "machine": machine,
        "started_unix_s": started,
        "load_average_1m": {"start": load_start[0], "end": os.getloadavg()[0]},
        "other_activity": Activity.take(machine["disk_device"]).others_since(activity_start),
        "settings": _settings(plan),
        "latency": latency,
        "reference": reference,
        "throughput": throughput,
        "targets": _targets(plan, latency, reference),
    }


def _settings(plan: LogBenchPlan) -> dict[str, Any]:
    config = plan.store_config()
    return {
        "rate_per_s": plan.rate_per_s,
        "seconds_per_size": plan.seconds,
        "warmup_records": WARMUP_RECORDS,
        "throughput_records": plan.throughput_records,
        "throughput_bytes_max": plan.throughput_bytes_max,
        "in_flight_max": plan.in_flight_max,
        "one_at_a_time_seconds_max": plan.sync_seconds,
        "acknowledgement": (f"every append is one record; at most {plan.in_flight_max} appends outstanding, "
                            "the run ends when the last append's future completes"),
        "wal_block_linger_s": config.wal.block_linger_s,
        "wal_io_threads": config.wal.io_threads,
        "object_store": "local directory",
        "dir": str(plan.dir_path),
    }
