"""`stratalog bench catchup`: does a consumer reading a cold backlog slow down producers?

AutoMQ's claim: catch-up reads come from object storage, not from the disk the WAL writes to, so they
do not disturb the write path. The test:

1. Build a cold backlog: one stream of 4 KiB records, flushed to objects; the store is then closed and
   reopened, so its block cache is empty. With the local-directory object store the objects' pages are
   also dropped from the OS page cache (``posix_fadvise(DONTNEED)``) before each read phase, so every
   read phase goes to the disk (``--page-cache keep`` leaves them in memory, so reads cost CPU but no
   disk time: that tells disk contention from CPU contention). An S3 server's own caches are out of
   reach; the figures say which. Then the disk is left to settle (see ``settle``).
2. Producers, one thread per stream, append 1 KiB records (one per append) at a fixed total rate,
   paced by absolute deadlines. After a warm-up, phase A (idle) measures produce latency for
   ``seconds``; phase B starts a consumer thread that reads the whole backlog from offset 0 with
   ``fetch(max_bytes=1 MiB)`` and measures produce latency while it runs, and the consumer's rate.
   Phase B lasts only as long as the read, so its p99 is compared with the median p99 of idle windows
   of the same length (see ``windowed_p99_ms``). Phase C, for diagnosis, repeats the read from a fresh
   store with no producers: beside phase B it shows what the producers cost the reader.
3. Reference: the object store's raw ranged-get rate over the same bytes (the blocks' spans, 1 MiB
   gets), sequentially from one thread, then from as many threads as the block cache has.

Produce latency is reported from ``append()`` to the future completing, and from the time the record
was due: with producers and the consumer in one process, the consumer can delay a producer's call to
append itself (the GIL, the store's lock), which only the second figure shows.
"""

from __future__ import annotations

import math
import os
import shutil
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import numpy.typing as npt

from stratalog.bench.common import KIB_BYTES, MIB_BYTES, MS_PER_S, Activity, machine_info
from stratalog.bench.log import (
    FUTURE_WAIT_S_MAX,
    PROGRESS_EVERY_S,
    BenchFailedError,
    Completions,
    Progress,
    latency_summary_ms,
    target,
)
from stratalog.engine.config import StoreConfig
from stratalog.engine.metadata import RangeRow
from stratalog.engine.store import Stream, StreamStore
from stratalog.io.device import FileDevice, aligned_buffer
from stratalog.objects.local import LocalDirStore
from stratalog.objects.store import ObjectStore
from stratalog.objects.uri import open_object_store, redact
from stratalog.wal.config import FsyncPolicy

_T = TypeVar("_T")

BACKLOG_RECORD_BYTES = 4 * KIB_BYTES
PRODUCE_RECORD_BYTES = KIB_BYTES
#: Backlog records per append while building it: 256 KiB batches, so building is quick.
BACKLOG_BATCH_RECORDS = 64
#: Backlog appends outstanding while building it.
BACKLOG_IN_FLIGHT_MAX = 16
#: The consumer's fetch size, and the size of the reference's ranged gets.
FETCH_BYTES = 1 << 20
#: Producers run this long before phase A is timed: threads started, WAL buffers pooled.
WARMUP_S = 1.0
#: Before phase A the disk must be quiet: building the backlog leaves the disk (or the host under a
#: virtual one) writing back for seconds, and here stalls of 100-180 ms showed up in the first 2-4 s
#: after it. Quiet: SETTLE_QUIET_WRITES probe writes in a row (one 4 KiB O_DIRECT + O_DSYNC write every
#: SETTLE_INTERVAL_S) each done within SETTLE_WRITE_S_MAX; waited for at most SETTLE_S_MAX.
SETTLE_INTERVAL_S = 0.05
SETTLE_QUIET_WRITES = 40
SETTLE_WRITE_S_MAX = 0.005
SETTLE_S_MAX = 60.0
SETTLE_FILE_BYTES = 1 << 20
#: A catch-up read still going after this long has failed (512 MiB at under 1 MiB/s).
CATCHUP_SECONDS_MAX = 600.0
#: Targets: produce p99 during catch-up at most 1.5 x idle (the median p99 of idle windows as long as
#: phase B: see windowed_p99_ms); catch-up at least half the raw sequential get rate.
P99_RATIO_MAX = 1.5
CATCHUP_RATIO_MIN = 0.5
#: How many blocks the reference asks the metadata for (more than any backlog here has).
BLOCKS_MAX = 1 << 30


@dataclass(frozen=True, slots=True)
class CatchupBenchPlan:
    """Everything one `bench catchup` run does, resolved from the command line."""

    backlog_bytes: int
    rate_per_s: float
    producers: int
    seconds: float
    dir_path: Path
    object_store_uri: str | None
    fsync: FsyncPolicy
    reference_threads: int
    #: True: drop the local store's object files from the page cache before each read phase (reads go
    #: to the disk); False: leave them there (reads cost CPU only, which isolates CPU from disk effects).
    drop_page_cache: bool = True
    #: StoreConfig.cold_read_bytes_per_s_max for the catch-up phases (None: unlimited).
    cold_read_bytes_per_s_max: int | None = None

    def store_config(self) -> StoreConfig:
        base = StoreConfig()
        return replace(base, wal=replace(base.wal, fsync=self.fsync),
                       cold_read_bytes_per_s_max=self.cold_read_bytes_per_s_max)


# The backlog -----------------------------------------------------------------------------------------


def build_backlog(store: StreamStore, plan: CatchupBenchPlan, progress: Progress) -> dict[str, Any]:
    """Append ``plan.backlog_bytes`` of 4 KiB records to a new stream, then flush it all to objects."""
    stream = store.create_stream("backlog")
    records_total = max(1, plan.backlog_bytes // BACKLOG_RECORD_BYTES)
    batch = [os.urandom(BACKLOG_RECORD_BYTES) for _ in range(BACKLOG_BATCH_RECORDS)]
    window: deque[Future[int]] = deque()
    started_s = time.perf_counter()
    appended = 0
    while appended < records_total:
        if len(window) >= BACKLOG_IN_FLIGHT_MAX:
            window.popleft().result(timeout=FUTURE_WAIT_S_MAX)
            progress.advance(appended / records_total)
        count = min(BACKLOG_BATCH_RECORDS, records_total - appended)
        window.append(stream.append(batch[:count]))
        appended += count
    while window:
        window.popleft().result(timeout=FUTURE_WAIT_S_MAX)
    store.flush()
    seconds = time.perf_counter() - started_s
    rows = store.metadata.ranges(stream.stream_id, 0, limit=BLOCKS_MAX)
    return {
        "stream_id": stream.stream_id,
        "records": records_total,
        "record_bytes": BACKLOG_RECORD_BYTES,
        "payload_bytes": records_total * BACKLOG_RECORD_BYTES,
        "block_bytes": sum(r.size_bytes for r in rows),
        "blocks": len(rows),
        "objects": len({r.key for r in rows}),
        "build_seconds": seconds,
        "build_mib_per_s": records_total * BACKLOG_RECORD_BYTES / MIB_BYTES / seconds,
    }


def drop_page_cache(objects: ObjectStore) -> int | None:
    """Drop a local store's files from the OS page cache; the number of files, None if not local."""
    if not isinstance(objects, LocalDirStore):
        return None
    dropped = 0
    for directory, _, names in os.walk(objects.root):
        for name in names:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # clean pages (objects are fsynced) go
            finally:
                os.close(fd)
            dropped += 1
    return dropped


def settle(dir_path: Path) -> dict[str, Any]:
    """Flush the page cache's dirty pages, then wait until small synced writes are quick again."""
    started_s = time.perf_counter()
    os.sync()
    path = dir_path / "settle.probe"
    device = FileDevice.open(path, size_bytes=SETTLE_FILE_BYTES, create=True, sync_writes=True)
    buf = aligned_buffer(4 * KIB_BYTES)
    slowest_s = 0.0
    try:
        quiet = writes = 0
        while quiet < SETTLE_QUIET_WRITES and time.perf_counter() - started_s < SETTLE_S_MAX:
            time.sleep(SETTLE_INTERVAL_S)
            write_s = time.perf_counter()
            device.pwrite(buf, writes % (SETTLE_FILE_BYTES // len(buf)) * len(buf))
            write_s = time.perf_counter() - write_s
            slowest_s = max(slowest_s, write_s)
            quiet = quiet + 1 if write_s <= SETTLE_WRITE_S_MAX else 0
            writes += 1
    finally:
        buf.close()
        device.close()
        path.unlink(missing_ok=True)
    return {"seconds": time.perf_counter() - started_s, "quiet": quiet >= SETTLE_QUIET_WRITES,
            "slowest_write_ms": slowest_s * 1000}


# Producers -------------------------------------------------------------------------------------------


class Producer(threading.Thread):
    """Appends one 1 KiB record to its stream at ``rate_per_s``, the i-th due at ``start + i / rate``.

    Behind schedule (the thread was held up), it appends what it owes at once: a stall then shows as
    latency from the due time, not as fewer records.
    """

    def __init__(self, stream: Stream, rate_per_s: float, first_s: float, seconds_max: float) -> None:
        super().__init__(name=f"bench-producer-{stream.stream_id}", daemon=True)
        self._stream = stream
        self._interval_s = 1.0 / rate_per_s
        self._first_s = first_s
        capacity = math.ceil(rate_per_s * seconds_max) + 1
        self.due_s = np.empty(capacity)
        self.started_s = np.empty(capacity)
        self.completions = Completions(capacity)
        self.count = 0
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        try:
            self._loop()
        except BaseException as e:
            self.error = e

    def _loop(self) -> None:
        payload = [os.urandom(PRODUCE_RECORD_BYTES)]
        append = self._stream.append
        watch = self.completions.watch
        clock = time.perf_counter
        stopping = self._stop_event.is_set
        capacity = self.due_s.size
        i = 0
        while i < capacity and not stopping():
            due = self._first_s + i * self._interval_s
            now = clock()
            if now < due:
                time.sleep(due - now)
            self.due_s[i] = due
            self.started_s[i] = clock()
            watch(i, append(payload))
            i += 1
            self.count = i

    def finish(self) -> None:
        self.join()
        if self.error is not None:
            raise BenchFailedError(f"{self.name} failed: {self.error}") from self.error
        self.completions.wait_all(self.count, self.name)


def _due_within(producers: list[Producer], from_s: float,
                to_s: float) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Due, start and completion times of the records due within ``[from_s, to_s)``, from all producers."""
    started, done, due = [], [], []
    for p in producers:
        n = p.count
        chosen = (p.due_s[:n] >= from_s) & (p.due_s[:n] < to_s)
        due.append(p.due_s[:n][chosen])
        started.append(p.started_s[:n][chosen])
        done.append(p.completions.done_s[:n][chosen])
    return np.concatenate(due), np.concatenate(started), np.concatenate(done)


def produce_latency(producers: list[Producer], from_s: float, to_s: float) -> dict[str, Any]:
    """Latency of the records due within ``[from_s, to_s)``, from all producers."""
    due_s, started_s, done_s = _due_within(producers, from_s, to_s)
    return {
        "seconds": to_s - from_s,
        "count": int(due_s.size),
        "latency_ms": latency_summary_ms(done_s - started_s),
        "latency_from_due_ms": latency_summary_ms(done_s - due_s),
    }


def windowed_p99_ms(producers: list[Producer], from_s: float, to_s: float, window_s: float) -> dict[str, Any]:
    """p99 of latency from the due time in each whole window of ``window_s`` within ``[from_s, to_s)``.

    Phase B lasts as long as the read (a second or two); phase A is long, and a periodic event (an upload)
    falls in it but may miss phase B. Comparing phase B with the median p99 of idle windows as long as
    phase B compares like with like: the same number of samples, the same chance to meet such an event.
    """
    count = int((to_s - from_s) // window_s) if window_s > 0 else 0
    p99s = []
    for i in range(count):
        due_s, _, done_s = _due_within(producers, from_s + i * window_s, from_s + (i + 1) * window_s)
        if due_s.size:
            p99s.append(float(np.percentile(done_s - due_s, 99.0)) * MS_PER_S)
    if not p99s:
        return {"window_s": window_s, "windows": 0, "median": 0.0, "min": 0.0, "max": 0.0}
    return {"window_s": window_s, "windows": len(p99s), "median": float(np.median(p99s)),
            "min": min(p99s), "max": max(p99s)}


# The consumer ----------------------------------------------------------------------------------------


@dataclass(slots=True)
class CatchupRead:
    """What the consumer read, and when; filled by its thread."""

    end_offset: int
    records: int = 0
    payload_bytes: int = 0
    fetches: int = 0
    started_s: float = 0.0
    done_s: float = 0.0
    #: CPU time of the consumer's own thread (fetch calls and counting; not the block cache's threads).
    cpu_s: float = 0.0
    error: BaseException | None = None

    def run(self, stream: Stream) -> None:
        try:
            cpu_start_s = time.thread_time()
            self.started_s = time.perf_counter()
            position = 0
            while position < self.end_offset:
                records = stream.fetch(position, self.end_offset, max_bytes=FETCH_BYTES)
                if not records or records[0].offset != position:
                    raise BenchFailedError(f"fetch at offset {position} returned "
                                           f"{records[0].offset if records else 'nothing'}")
                self.fetches += 1
                self.records += len(records)
                self.payload_bytes += sum(len(r.value) for r in records)
                position = records[-1].offset + 1
            self.done_s = time.perf_counter()
            self.cpu_s = time.thread_time() - cpu_start_s
        except BaseException as e:
            self.error = e


def read_backlog(stream: Stream, end_offset: int, progress: Progress) -> CatchupRead:
    """Read ``[0, end_offset)`` on a consumer thread; return once it has."""
    read = CatchupRead(end_offset)
    consumer = threading.Thread(target=read.run, args=(stream,), name="bench-consumer", daemon=True)
    consumer.start()
    deadline_s = time.perf_counter() + CATCHUP_SECONDS_MAX
    while consumer.is_alive():
        consumer.join(PROGRESS_EVERY_S)
        progress.advance(read.records / end_offset)
        if time.perf_counter() > deadline_s:
            raise BenchFailedError(f"the catch-up read was not done after {CATCHUP_SECONDS_MAX} s")
    if read.error is not None:
        raise BenchFailedError(f"the catch-up read failed: {read.error}") from read.error
    return read


# The reference ---------------------------------------------------------------------------------------


def get_ranges(rows: list[RangeRow]) -> list[tuple[str, int, int]]:
    """The blocks' bytes as ``(key, start, end)`` gets of at most 1 MiB, merged where blocks touch."""
    spans: list[list[Any]] = []
    for row in rows:
        if spans and spans[-1][0] == row.key and spans[-1][2] == row.position:
            spans[-1][2] = row.position + row.size_bytes
        else:
            spans.append([row.key, row.position, row.position + row.size_bytes])
    return [(key, at, min(at + FETCH_BYTES, end)) for key, start, end in spans
            for at in range(start, end, FETCH_BYTES)]


def raw_gets(objects: ObjectStore, gets: list[tuple[str, int, int]], threads: int) -> dict[str, Any]:
    """Time ranged gets of ``gets`` through the object store: in order from one thread, or from
    ``threads`` threads taking them in order."""

    def one(get: tuple[str, int, int]) -> int:
        return len(objects.get(*get))

    started_s = time.perf_counter()
    if threads == 1:
        got = sum(one(g) for g in gets)
    else:
        with ThreadPoolExecutor(threads, thread_name_prefix="bench-get") as pool:
            got = sum(pool.map(one, gets))
    seconds = time.perf_counter() - started_s
    expected = sum(end - start for _, start, end in gets)
    if got != expected:
        raise BenchFailedError(f"the ranged gets returned {got} bytes, {expected} were asked for")
    return {"threads": threads, "gets": len(gets), "bytes": got, "seconds": seconds,
            "mib_per_s": got / MIB_BYTES / seconds}


# The whole run ---------------------------------------------------------------------------------------


PHASES = 7  # build, settle, idle, catch-up, catch-up alone, raw sequential, raw parallel


@dataclass(slots=True)
class _Phases:
    """What the producers and the consumer did in phases A and B."""

    idle: dict[str, Any]
    catchup: dict[str, Any]
    read: CatchupRead
    produced: int


@dataclass(slots=True)
class ProducedAround(Generic[_T]):
    """What ``produce_around`` did: the producers (their records' times), phase A's window, what phase B's
    work returned."""

    producers: list[Producer]
    idle_from_s: float
    idle_to_s: float
    during: _T


def produce_around(streams: list[Stream], rate_per_s: float, seconds: float, seconds_max: float,
                   progress: Progress, during: Callable[[], _T]) -> ProducedAround[_T]:
    """One producer thread a stream, at ``rate_per_s`` in all: idle for ``seconds`` after the warm-up
    (phase A), then while ``during()`` runs (phase B); stopped and every append waited for after it."""
    start_s = time.perf_counter() + 0.01
    # Staggered, so together they append evenly spaced, as one producer at the total rate would.
    producers = [Producer(s, rate_per_s / len(streams), start_s + i / rate_per_s, seconds_max)
                 for i, s in enumerate(streams)]
    progress.phase(f"phase A (idle): {rate_per_s:,.0f} x 1 KiB appends/s for {seconds:g} s")
    for p in producers:
        p.start()
    try:
        idle_from_s = start_s + WARMUP_S
        idle_to_s = idle_from_s + seconds
        while (now := time.perf_counter()) < idle_to_s:
            time.sleep(min(PROGRESS_EVERY_S, idle_to_s - now))
            progress.advance((now - start_s) / (idle_to_s - start_s))
        result = during()
    finally:
        for p in producers:
            p.stop()
    for p in producers:
        p.finish()
    return ProducedAround(producers, idle_from_s, idle_to_s, result)


def _produce_and_catch_up(store: StreamStore, plan: CatchupBenchPlan, backlog: dict[str, Any],
                          progress: Progress) -> _Phases:
    def catch_up() -> CatchupRead:
        progress.phase(f"phase B (catch-up): reading {backlog['payload_bytes'] / MIB_BYTES:,.0f} MiB "
                       "from offset 0 while producing")
        return read_backlog(store.open_stream(backlog["stream_id"]), backlog["records"], progress)

    streams = [store.open_stream(f"producer-{i}") for i in range(plan.producers)]
    run = produce_around(streams, plan.rate_per_s, plan.seconds, WARMUP_S + plan.seconds + CATCHUP_SECONDS_MAX,
                         progress, catch_up)
    read = run.during
    idle = produce_latency(run.producers, run.idle_from_s, run.idle_to_s)
    idle["windows_p99_ms"] = windowed_p99_ms(run.producers, run.idle_from_s, run.idle_to_s,
                                             read.done_s - read.started_s)
    return _Phases(idle, produce_latency(run.producers, read.started_s, read.done_s),
                   read, sum(p.count for p in run.producers))


def _reference(store: StreamStore, plan: CatchupBenchPlan, backlog: dict[str, Any],
               progress: Progress) -> dict[str, Any]:
    gets = get_ranges(store.metadata.ranges(backlog["stream_id"], 0, limit=BLOCKS_MAX))
    result: dict[str, Any] = {"get_bytes": FETCH_BYTES}
    for name, threads in (("sequential", 1), ("parallel", plan.reference_threads)):
        progress.phase(f"reference: raw {FETCH_BYTES >> 20} MiB ranged gets, {name} ({threads} thread"
                       f"{'s' if threads > 1 else ''})")
        if plan.drop_page_cache:
            drop_page_cache(store.object_store)
        result[name] = raw_gets(store.object_store, gets, threads)
    return result


def _targets(idle: dict[str, Any], catchup: dict[str, Any], read_mib_per_s: float,
             reference: dict[str, Any], fsync: FsyncPolicy) -> list[dict[str, Any]]:
    idle_p99 = idle["windows_p99_ms"]["median"]
    ratio = catchup["latency_from_due_ms"]["p99"] / idle_p99 if idle_p99 else math.inf
    raw = reference["sequential"]["mib_per_s"]
    applies = fsync is FsyncPolicy.ALWAYS
    return [
        target("produce p99 catch-up / idle", ratio, P99_RATIO_MAX, at_least=False, applies=applies,
               why_not="" if applies else f"fsync={fsync.value}: the target is for fsync=always"),
        target("catch-up / raw sequential gets", read_mib_per_s / raw if raw else 0.0, CATCHUP_RATIO_MIN,
               at_least=True),
    ]


def _read_figures(read: CatchupRead, backlog: dict[str, Any]) -> dict[str, Any]:
    seconds = read.done_s - read.started_s
    return {
        "records": read.records, "payload_bytes": read.payload_bytes, "block_bytes": backlog["block_bytes"],
        "fetches": read.fetches, "fetch_max_bytes": FETCH_BYTES, "seconds": seconds,
        "mib_per_s": backlog["block_bytes"] / MIB_BYTES / seconds,
        "payload_mib_per_s": read.payload_bytes / MIB_BYTES / seconds,
        "consumer_cpu_s": read.cpu_s,
        "consumer_cpu_ms_per_mib": read.cpu_s * 1000 / (backlog["block_bytes"] / MIB_BYTES),
    }


def _page_cache_note(plan: CatchupBenchPlan, objects: ObjectStore) -> str:
    if not isinstance(objects, LocalDirStore):
        return "not controlled (not a local directory store)"
    if plan.drop_page_cache:
        return "dropped before each read phase (reads go to the disk)"
    return "kept (objects read from memory: CPU cost only)"


def _iter_results(plan: CatchupBenchPlan, data_dir: Path, progress: Progress) -> Iterator[tuple[str, Any]]:
    config = plan.store_config()
    progress.phase(f"building the backlog: {plan.backlog_bytes / MIB_BYTES:,.0f} MiB of 4 KiB records")
    with StreamStore.open(data_dir, plan.object_store_uri, config) as store:
        backlog = build_backlog(store, plan, progress)
        for i in range(plan.producers):
            store.create_stream(f"producer-{i}")
        yield "backlog", backlog
    # A fresh store on the same directory: nothing of the backlog in its block cache.
    with StreamStore.open(data_dir, plan.object_store_uri, config) as store:
        if plan.drop_page_cache:
            drop_page_cache(store.object_store)
        yield "page_cache", _page_cache_note(plan, store.object_store)
        progress.phase("settling: waiting for the disk to finish writing the backlog back")
        yield "settle", settle(plan.dir_path)
        phases = _produce_and_catch_up(store, plan, backlog, progress)
        yield "produce", {"rate_per_s": plan.rate_per_s, "producers": plan.producers,
                          "record_bytes": PRODUCE_RECORD_BYTES, "records": phases.produced,
                          "idle": phases.idle, "catchup": phases.catchup}
        catchup_read = _read_figures(phases.read, backlog)
        yield "catchup_read", catchup_read
    # Phase C, for diagnosis: the same read with no producers, from a fresh store again. Beside phase B it
    # says how much of the read rate the producers took.
    with StreamStore.open(data_dir, plan.object_store_uri, config) as store:
        progress.phase("phase C: the same catch-up read with no producers")
        if plan.drop_page_cache:
            drop_page_cache(store.object_store)
        alone = read_backlog(store.open_stream(backlog["stream_id"]), backlog["records"], progress)
        yield "catchup_read_alone", _read_figures(alone, backlog)
        reference = _reference(store, plan, backlog, progress)
        yield "raw_ranged_get", reference
    yield "targets", _targets(phases.idle, phases.catchup, catchup_read["mib_per_s"], reference, plan.fsync)


def _under_own_prefix(uri: str | None, tag: str) -> str | None:
    """An S3 URI with ``tag`` appended to its prefix: the run's objects go there and are deleted after."""
    if uri is None:
        return None
    parts = urlsplit(uri)
    return urlunsplit(parts._replace(path=f"{parts.path.rstrip('/')}/{tag}"))


def _delete_all(uri: str, data_dir: Path) -> None:
    objects = open_object_store(uri, data_dir)
    try:
        if isinstance(objects, LocalDirStore):
            shutil.rmtree(objects.root, ignore_errors=True)
            return
        for info in list(objects.list()):
            objects.delete(info.key)
    finally:
        objects.close()


def run_catchup_bench(plan: CatchupBenchPlan, progress: Progress) -> dict[str, Any]:
    """Run every phase of the plan; return the JSON document. Leaves no file or object behind."""
    load_start = os.getloadavg()
    machine = machine_info(plan.dir_path)
    activity_start = Activity.take(machine["disk_device"])
    tag = f"bench-catchup-{uuid.uuid4().hex[:8]}"
    data_dir = plan.dir_path / tag
    own = replace(plan, object_store_uri=_under_own_prefix(plan.object_store_uri, tag))
    started = time.time()
    try:
        results = dict(_iter_results(own, data_dir, progress))
    finally:
        if own.object_store_uri is not None:
            _delete_all(own.object_store_uri, data_dir)
        shutil.rmtree(data_dir, ignore_errors=True)
    return {
        "bench": "catchup",
        "fsync": plan.fsync.value,
        "object_store": redact(plan.object_store_uri) if plan.object_store_uri else "local directory",
        "machine": machine,
        "started_unix_s": started,
        "load_average_1m": {"start": load_start[0], "end": os.getloadavg()[0]},
        "other_activity": Activity.take(machine["disk_device"]).others_since(activity_start),
        "settings": _settings(plan),
        **results,
    }


def _settings(plan: CatchupBenchPlan) -> dict[str, Any]:
    config = plan.store_config()
    return {
        "backlog_bytes": plan.backlog_bytes,
        "rate_per_s": plan.rate_per_s,
        "producers": plan.producers,
        "idle_seconds": plan.seconds,
        "warmup_s": WARMUP_S,
        "fetch_max_bytes": FETCH_BYTES,
        "reference_threads": plan.reference_threads,
        "drop_page_cache": plan.drop_page_cache,
        "block_cache_bytes_max": config.block_cache_bytes_max,
        "block_cache_io_threads": config.block_cache_io_threads,
        "readahead_blocks_max": config.readahead_blocks_max,
        "cold_read_bytes_per_s_max": config.cold_read_bytes_per_s_max,
        "dir": str(plan.dir_path),
    }
