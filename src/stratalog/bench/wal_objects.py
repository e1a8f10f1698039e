"""`stratalog bench wal-objects`: the object WAL against the device WAL, in one run.

Each target is a WAL the stream store could run on: the device WAL on a file (fsync always), the object
WAL on the local directory store, and the object WAL on an S3 API server when one is given. Each runs
two phases of ``seconds``:

- ``serial``: one append at a time, each waited for: the latency of a lone record (an idle producer).
- ``flat out``: appends kept ``outstanding_max`` deep: throughput, and the latency under that load.

Both trim every ``trim_interval_s`` to the last acknowledged record, as the stream store's uploads do,
so the device WAL's ring never fills and the object WAL pays for its trim markers and deletes.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import numpy as np

from stratalog.bench.common import MIB_BYTES, Activity, machine_info, summarize_latency_ms
from stratalog.objects.local import LocalDirStore
from stratalog.objects.store import ObjectStore
from stratalog.objects.uri import open_object_store, redact
from stratalog.wal.config import ObjectWALConfig
from stratalog.wal.log import WriteAheadLog
from stratalog.wal.object_wal import ObjectWAL
from stratalog.wal.protocol import WAL

#: Latency samples kept per phase: enough for a p99 at any rate this bench reaches, bounded in memory.
SAMPLES_MAX = 1_000_000
#: The device WAL's file: four times what one trim interval of flat-out appends writes on a fast disk.
DEVICE_CAPACITY_BYTES = 256 * MIB_BYTES


@dataclass(frozen=True, slots=True)
class WalObjectsBenchPlan:
    dir_path: Path
    record_bytes: int = 4096
    seconds: float = 3.0
    #: Appends in flight in the flat-out phase: deep enough to fill every put slot with full objects.
    outstanding_max: int = 1024
    trim_interval_s: float = 0.5
    #: An S3 API store to run the object WAL on too (``s3://bucket/prefix?endpoint=...``); None: skip it.
    s3_uri: str | None = None
    object_config: ObjectWALConfig = field(default_factory=ObjectWALConfig)
    device_capacity_bytes: int = DEVICE_CAPACITY_BYTES


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    #: Opens the WAL (recovered, ready for appends) and yields it; cleans up after.
    open: Callable[[], contextlib.AbstractContextManager[WAL]]


def targets(plan: WalObjectsBenchPlan) -> list[Target]:
    made = [
        Target("device WAL (file, fsync always)",
               lambda: _device_wal(plan.dir_path / "device-wal", plan.device_capacity_bytes)),
        Target("object WAL, local directory", lambda: _object_wal(
            LocalDirStore(plan.dir_path / "objects"), plan.object_config)),
    ]
    if plan.s3_uri is not None:
        uri = plan.s3_uri
        made.append(Target(f"object WAL, S3 ({_endpoint_of(uri)})", lambda: _object_wal(
            open_object_store(uri, plan.dir_path), plan.object_config)))
    return made


def _endpoint_of(uri: str) -> str:
    endpoint = parse_qs(urlsplit(uri).query).get("endpoint", [""])[0]
    return urlsplit(endpoint).netloc or redact(uri)


@contextlib.contextmanager
def _device_wal(path: Path, capacity_bytes: int) -> Iterator[WAL]:
    wal = WriteAheadLog.open(path, capacity_bytes=capacity_bytes, create=True)
    try:
        for _ in wal.recover():
            pass
        yield wal
    finally:
        wal.close()
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def _object_wal(store: ObjectStore, config: ObjectWALConfig) -> Iterator[WAL]:
    owner = f"bench-{secrets.token_hex(4)}"
    wal = ObjectWAL.open(store, owner, config)
    try:
        for _ in wal.recover():
            pass
        yield wal
    finally:
        wal.close()
        for info in list(store.list(wal.prefix)):
            store.delete(info.key)
        store.close()


class _Trimmer:
    """Remembers the last acknowledged offset (futures complete in offset order) and trims to it."""

    def __init__(self, wal: WAL, interval_s: float) -> None:
        self._wal = wal
        self._interval_s = interval_s
        self._next_s = time.perf_counter() + interval_s
        self.acked_offset = -1
        self.trims = 0

    def maybe_trim(self, now_s: float) -> None:
        if now_s < self._next_s:
            return
        self._next_s = now_s + self._interval_s
        if self.acked_offset > self._wal.trim_offset:
            self._wal.trim(self.acked_offset)
            self.trims += 1


def _serial(wal: WAL, payload: bytes, seconds: float, trim_interval_s: float) -> dict[str, Any]:
    trimmer = _Trimmer(wal, trim_interval_s)
    latencies = np.empty(SAMPLES_MAX)
    count = 0
    started = time.perf_counter()
    end = started + seconds
    now = started
    while now < end and count < SAMPLES_MAX:
        result = wal.append(payload)
        result.future.result()
        after = time.perf_counter()
        latencies[count] = after - now
        count += 1
        trimmer.acked_offset = result.offset
        trimmer.maybe_trim(after)
        now = after
    elapsed = now - started
    return _figures(latencies[:count], count, len(payload), elapsed, trimmer.trims)


def _flat_out(wal: WAL, payload: bytes, seconds: float, outstanding_max: int,
              trim_interval_s: float) -> dict[str, Any]:
    trimmer = _Trimmer(wal, trim_interval_s)
    room = threading.BoundedSemaphore(outstanding_max)
    latencies = np.empty(SAMPLES_MAX)
    done = [0]
    errors: list[BaseException] = []

    def on_durable(offset: int, appended_s: float, future: Future[int]) -> None:
        # Runs on the WAL's completion thread, in offset order.
        if future.exception() is not None:
            errors.append(future.exception())  # type: ignore[arg-type]
        elif done[0] < SAMPLES_MAX:
            latencies[done[0]] = time.perf_counter() - appended_s
            done[0] += 1
            trimmer.acked_offset = offset
        room.release()

    started = time.perf_counter()
    end = started + seconds
    now = started
    appended = 0
    last: Future[int] | None = None
    while now < end and appended < SAMPLES_MAX and not errors:
        room.acquire()
        now = time.perf_counter()
        result = wal.append(payload)
        result.future.add_done_callback(functools.partial(on_durable, result.offset, now))
        last = result.future
        appended += 1
        trimmer.maybe_trim(now)
    if last is not None:
        last.exception()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return _figures(latencies[:done[0]], done[0], len(payload), elapsed, trimmer.trims)


def _figures(latencies_s: np.ndarray[Any, np.dtype[np.float64]], records: int, record_bytes: int,
             elapsed_s: float, trims: int) -> dict[str, Any]:
    return {
        "records": records,
        "seconds": elapsed_s,
        "records_per_s": records / elapsed_s if elapsed_s else 0.0,
        "mib_per_s": records * record_bytes / MIB_BYTES / elapsed_s if elapsed_s else 0.0,
        "latency_ms": summarize_latency_ms(latencies_s),
        "trims": trims,
    }


def run_wal_objects_bench(plan: WalObjectsBenchPlan, progress: Callable[[str], None] = lambda _: None
                          ) -> dict[str, Any]:
    """Run every target's two phases; return the figures as a JSON-ready document."""
    machine = machine_info(plan.dir_path)
    before = Activity.take(machine["disk_device"])
    load_start = os.getloadavg()[0]
    payload = os.urandom(plan.record_bytes)
    results = []
    for target in targets(plan):
        figures: dict[str, Any] = {"target": target.name}
        with target.open() as wal:
            progress(f"{target.name}: serial")
            figures["serial"] = _serial(wal, payload, plan.seconds, plan.trim_interval_s)
        with target.open() as wal:
            progress(f"{target.name}: flat out")
            figures["flat_out"] = _flat_out(wal, payload, plan.seconds, plan.outstanding_max, plan.trim_interval_s)
        results.append(figures)
    config = plan.object_config
    return {
        "benchmark": "wal-objects",
        "machine": machine,
        "record_bytes": plan.record_bytes,
        "seconds_per_phase": plan.seconds,
        "outstanding_max": plan.outstanding_max,
        "trim_interval_s": plan.trim_interval_s,
        "object_wal_config": {
            "linger_s": config.linger_s,
            "object_bytes_soft_max": config.object_bytes_soft_max,
            "puts_in_flight_max": config.puts_in_flight_max,
        },
        "s3": redact(plan.s3_uri) if plan.s3_uri else None,
        "load_average_1m": {"start": load_start, "end": os.getloadavg()[0]},
        "other_activity": Activity.take(machine["disk_device"]).others_since(before),
        "targets": results,
    }
