"""`stratalog bench compaction`: how fast does log compaction clean, and what does it cost producers?

The test, in one process over one store (as a broker runs its cleaner beside its produce path):

1. Build a compacted stream: keyed 1 KiB records over ``keys`` keys, each key written about
   ``backlog_bytes / keys / 1 KiB`` times, in Kafka batches of 64 records (what a producer sends), uploaded
   to objects. The store is then closed and reopened (an empty block cache), and the disk left to settle.
2. Producers, one thread per stream of their own, append 1 KiB records at a fixed total rate (catchup.py's
   producers). After a warm-up, phase A (idle) measures produce latency for ``seconds``; phase B runs one
   pass of the cleaner over the compacted stream (``StreamStore.clean_stream``, with the store's cleaner
   bounds: a broker's) and measures produce latency while it runs. Phase B's p99 is compared with the median
   p99 of idle windows as long as it (see ``catchup.windowed_p99_ms``).
3. The compaction rate is the pass's input (the blocks it read to build its key map and to rewrite, and
   the stream's bytes before) over its time; the reference is the object store's raw 1 MiB ranged gets of
   the same blocks, from one thread, measured in the same run.
"""

from __future__ import annotations

import math
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from stratalog.bench.catchup import (
    PRODUCE_RECORD_BYTES,
    WARMUP_S,
    drop_page_cache,
    get_ranges,
    produce_around,
    produce_latency,
    raw_gets,
    settle,
    windowed_p99_ms,
)
from stratalog.bench.common import KIB_BYTES, MIB_BYTES, Activity, machine_info
from stratalog.bench.log import Progress, target
from stratalog.engine.cleaner import CleanPolicy, CleanReport
from stratalog.engine.config import CleanerBounds, StoreConfig
from stratalog.engine.store import Stream, StreamStore
from stratalog.kafka.records import encode_batch
from stratalog.wal.config import FsyncPolicy

RECORD_BYTES = KIB_BYTES
#: Records per Kafka batch while building the stream: what a producer with a few ms of linger sends.
BATCH_RECORDS = 64
#: Appends outstanding while building it.
IN_FLIGHT_MAX = 16
#: A pass still going after this long has failed.
PASS_SECONDS_MAX = 1800.0
#: Target: produce p99 while a pass runs at most 1.5 x idle (the issue's bound).
P99_RATIO_MAX = 1.5
#: Every record is older than the lag and the stream wholly dirty: the pass cleans all of it.
POLICY = CleanPolicy(delete_retention_ms=86_400_000, min_compaction_lag_ms=0, min_cleanable_dirty_ratio=0.0)
BLOCKS_MAX = 1 << 30


@dataclass(frozen=True, slots=True)
class CompactionBenchPlan:
    """Everything one `bench compaction` run does, resolved from the command line."""

    backlog_bytes: int
    keys: int
    rate_per_s: float
    producers: int
    seconds: float
    dir_path: Path
    fsync: FsyncPolicy
    cleaner: CleanerBounds

    def store_config(self) -> StoreConfig:
        base = StoreConfig()
        return replace(base, wal=replace(base.wal, fsync=self.fsync), cleaner=self.cleaner)


def build_stream(store: StreamStore, plan: CompactionBenchPlan, progress: Progress) -> dict[str, Any]:
    """The keyed stream to compact, uploaded; what it holds."""
    stream = store.create_stream("compacted")
    records = max(BATCH_RECORDS, plan.backlog_bytes // RECORD_BYTES)
    value = os.urandom(RECORD_BYTES - 16)
    started = time.perf_counter()
    pending = []
    for first in range(0, records, BATCH_RECORDS):
        count = min(BATCH_RECORDS, records - first)
        fields = [(f"key-{(first + i) % plan.keys:012d}".encode(), value, (), 0) for i in range(count)]
        pending.append(stream.append_kafka(encode_batch(fields, base_offset=0), count, 0))
        if len(pending) >= IN_FLIGHT_MAX:
            pending.pop(0).result()
        progress.advance(first / records)
    for f in pending:
        f.result()
    store.flush()
    rows = store.metadata.ranges(stream.stream_id, 0, limit=BLOCKS_MAX)
    return {"stream_id": stream.stream_id, "records": records, "keys": plan.keys,
            "block_bytes": sum(r.size_bytes for r in rows), "blocks": len(rows),
            "build_mib_per_s": records * RECORD_BYTES / MIB_BYTES / (time.perf_counter() - started)}


def _clean(store: StreamStore, stream: Stream) -> tuple[CleanReport, float, float]:
    started = time.perf_counter()
    report = store.clean_stream(stream, POLICY, now_ms=int(time.time() * 1000))
    return report, started, time.perf_counter()


def _produce_and_compact(store: StreamStore, plan: CompactionBenchPlan, built: dict[str, Any],
                         progress: Progress) -> dict[str, Any]:
    def compact() -> tuple[CleanReport, float, float]:
        progress.phase(f"phase B: one pass of compaction over {built['block_bytes'] / MIB_BYTES:,.0f} MiB while "
                       "producing")
        return _clean(store, store.open_stream("compacted"))

    streams = [store.open_stream(f"producer-{i}") for i in range(plan.producers)]
    run = produce_around(streams, plan.rate_per_s, plan.seconds, WARMUP_S + plan.seconds + PASS_SECONDS_MAX,
                         progress, compact)
    report, pass_from_s, pass_to_s = run.during
    idle = produce_latency(run.producers, run.idle_from_s, run.idle_to_s)
    idle["windows_p99_ms"] = windowed_p99_ms(run.producers, run.idle_from_s, run.idle_to_s, pass_to_s - pass_from_s)
    return {"rate_per_s": plan.rate_per_s, "producers": plan.producers, "record_bytes": PRODUCE_RECORD_BYTES,
            "records": sum(p.count for p in run.producers), "idle": idle,
            "compacting": produce_latency(run.producers, pass_from_s, pass_to_s), "pass": _pass_figures(report, built)}


def _pass_figures(report: CleanReport, built: dict[str, Any]) -> dict[str, Any]:
    seconds = report.seconds
    return {**asdict(report), "input_bytes": built["block_bytes"],
            "input_mib_per_s": built["block_bytes"] / MIB_BYTES / seconds if seconds else 0.0,
            "read_mib_per_s": report.bytes_read / MIB_BYTES / seconds if seconds else 0.0,
            "written_share": report.bytes_written / built["block_bytes"] if built["block_bytes"] else 0.0}


def _iter_results(plan: CompactionBenchPlan, data_dir: Path, progress: Progress) -> Iterator[tuple[str, Any]]:
    config = plan.store_config()
    progress.phase(f"building the stream: {plan.backlog_bytes / MIB_BYTES:,.0f} MiB of 1 KiB records over "
                   f"{plan.keys:,} keys")
    with StreamStore.open(data_dir, None, config) as store:
        built = build_stream(store, plan, progress)
        for i in range(plan.producers):
            store.create_stream(f"producer-{i}")
        yield "stream", built
    with StreamStore.open(data_dir, None, config) as store:   # an empty block cache
        # The reference: raw 1 MiB ranged gets of the blocks the pass will read, from one thread.
        progress.phase("reference: raw 1 MiB ranged gets of the stream's blocks, one thread")
        drop_page_cache(store.object_store)
        gets = get_ranges(store.metadata.ranges(built["stream_id"], 0, limit=BLOCKS_MAX))
        yield "raw_ranged_get", raw_gets(store.object_store, gets, 1)
        drop_page_cache(store.object_store)
        progress.phase("settling: waiting for the disk to finish writing the stream back")
        yield "settle", settle(plan.dir_path)
        produce = _produce_and_compact(store, plan, built, progress)
        yield "produce", produce
    yield "targets", _targets(produce)


def _targets(produce: dict[str, Any]) -> list[dict[str, Any]]:
    idle_p99 = produce["idle"]["windows_p99_ms"]["median"]
    ratio = produce["compacting"]["latency_from_due_ms"]["p99"] / idle_p99 if idle_p99 else math.inf
    return [target("produce p99 compacting / idle", ratio, P99_RATIO_MAX, at_least=False)]


def run_compaction_bench(plan: CompactionBenchPlan, progress: Progress) -> dict[str, Any]:
    """Run every phase of the plan; return the JSON document. Leaves no file behind."""
    load_start = os.getloadavg()
    machine = machine_info(plan.dir_path)
    activity_start = Activity.take(machine["disk_device"])
    data_dir = plan.dir_path / f"bench-compaction-{uuid.uuid4().hex[:8]}"
    started = time.time()
    try:
        results = dict(_iter_results(plan, data_dir, progress))
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)
    return {
        "bench": "compaction",
        "fsync": plan.fsync.value,
        "object_store": "local directory",
        "machine": machine,
        "started_unix_s": started,
        "load_average_1m": {"start": load_start[0], "end": os.getloadavg()[0]},
        "other_activity": Activity.take(machine["disk_device"]).others_since(activity_start),
        "settings": {"backlog_bytes": plan.backlog_bytes, "keys": plan.keys, "rate_per_s": plan.rate_per_s,
                     "producers": plan.producers, "idle_seconds": plan.seconds, "warmup_s": WARMUP_S,
                     "batch_records": BATCH_RECORDS, "cleaner": asdict(plan.cleaner), "dir": str(plan.dir_path)},
        **results,
    }
