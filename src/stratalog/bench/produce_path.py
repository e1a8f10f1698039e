"""`stratalog bench produce-path`: what the broker does with one produced batch, step by step, on each core.

The profile behind the compiled core, kept as a benchmark: each step of the Produce path that is pure
computation (no socket, no disk) is timed in this process on the same request, once with the Python
twin and once with the compiled function where there is one. Steps without a compiled twin are timed
once and shown under both. The figures are the minimum over several repeats of a loop of calls: on a
shared machine the minimum is the run least disturbed by others, and the ratio between cores within one
run is what to read. The disk's and the socket's part of a produce is `bench kafka`'s and `bench log`'s.
"""

from __future__ import annotations

import datetime
import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stratalog.bench.common import machine_info, provenance
from stratalog.engine.batch import KAFKA_DECOMPRESSED_BYTES_MAX, wrap_kafka_batch
from stratalog.kafka.codec import decode_request, encode_request, peek_header
from stratalog.kafka.produce_request import decode_produce_fields
from stratalog.kafka.produce_response import ProducePartitionResult, ProduceTopicResult, encode_produce_response
from stratalog.kafka.record_check import walk_records
from stratalog.kafka.records import RECORDS_POSITION, Compression, check_batch, encode_batch, recompress
from stratalog.native import core, native

#: The batches a producer sends: librdkafka's batches at linger.ms=5 under load (100 B and 1 KiB), and
#: one record at a time as the latency runs send them.
SHAPES = ((100, 1000), (1024, 100), (256, 1))
PRODUCE_VERSION = 9
#: The codecs a topic's compression.type may name that the recompression steps time (the producer's batch
#: is uncompressed): lz4, the fast one, and zstd, Kafka's densest.
RECOMPRESSED_CODECS = (Compression.LZ4, Compression.ZSTD)
#: Records a timed loop's calls carry in all: enough that one loop lasts well over the clock's resolution.
LOOP_RECORDS = 200_000
#: ... at --quick, which shows every step and its report in seconds: a loop still lasts milliseconds.
LOOP_RECORDS_QUICK = 20_000
#: Calls per timed loop at the least (the one-record shape's loops are the shortest).
LOOP_CALLS_MIN = 20


@dataclass(frozen=True, slots=True)
class Step:
    name: str
    python: Callable[[], object]
    compiled: Callable[[], object] | None = None
    #: A step only some topics take (a ``compression.type`` codec): shown apart, not in the sum.
    optional: bool = False


def produce_frame(value_bytes: int, count: int) -> tuple[bytes, bytes]:
    """A Produce request frame (v9, one partition, one batch of ``count`` records) and its batch."""
    from kio.schema.produce.v9.request import PartitionProduceData, ProduceRequest, TopicProduceData
    from kio.schema.types import TopicName
    from kio.static.primitive import Records, i16, i32, i32Timedelta

    now_ms = 1_700_000_000_000
    batch = encode_batch([(b"key-%d" % i, os.urandom(value_bytes), (), now_ms + i) for i in range(count)],
                         base_offset=0, producer_id=7, producer_epoch=0, base_sequence=0)
    body = ProduceRequest(acks=i16(-1), timeout=i32Timedelta.parse(datetime.timedelta(seconds=30)),
                          transactional_id=None, topic_data=(TopicProduceData(name=TopicName("bench"), partition_data=(
                              PartitionProduceData(index=i32(0), records=Records(batch)),)),))
    return encode_request(0, PRODUCE_VERSION, 1, "bench", body), batch


def steps(value_bytes: int, count: int) -> list[Step]:
    frame, batch = produce_frame(value_bytes, count)
    view = memoryview(batch)
    supported = {0: (PRODUCE_VERSION, PRODUCE_VERSION)}
    header = check_batch(view, 0, batch_bytes_max=len(batch))
    topics = [ProduceTopicResult("bench", [ProducePartitionResult(0, 0, base_offset=1 << 20, log_start_offset=0)])]
    compiled_walk = (lambda: native.walk_records(view, RECORDS_POSITION, count)) if native is not None else None
    return [
        # The codec takes the compiled reader where it is loaded: the twin is timed through its own entry.
        Step("decode the request", lambda: (peek_header(frame), decode_produce_fields(frame, True)),
             (lambda: decode_request(frame, supported)) if native is not None else None),
        Step("batch header, bounds and CRC32C", lambda: check_batch(view, 0, batch_bytes_max=len(batch))),
        # The twin walks a copy (indexing bytes is faster than a memoryview), as check_records gives it.
        Step("record check: every record walked", lambda: walk_records(bytes(view), RECORDS_POSITION, count),
             compiled_walk),
        Step("placed: base offset, store header and CRC, one copy",
             lambda: wrap_kafka_batch(1, 1 << 20, count, header.max_timestamp_ms, view)),
        Step("the response, packed", lambda: encode_produce_response(1, PRODUCE_VERSION, topics)),
        *(Step(f"compression.type={codec.name.lower()}: recompressed",
               functools.partial(recompress, view, header, codec, decompressed_bytes_max=KAFKA_DECOMPRESSED_BYTES_MAX),
               optional=True) for codec in RECOMPRESSED_CODECS),
    ]


def time_call(call: Callable[[], object], loops: int, repeats: int) -> float:
    """Seconds one call takes: the least of ``repeats`` loops of ``loops`` calls, divided."""
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(loops):
            call()
        best = min(best, time.perf_counter() - started)
    return best / loops


def measure_shape(value_bytes: int, count: int, repeats: int, progress: Callable[[], None],
                  loop_records: int = LOOP_RECORDS) -> dict[str, Any]:
    loops = max(LOOP_CALLS_MIN, loop_records // count)
    rows = []
    for step in steps(value_bytes, count):
        python_s = time_call(step.python, loops, repeats)
        compiled_s = time_call(step.compiled, loops, repeats) if step.compiled is not None else None
        rows.append({"step": step.name, "python_us": python_s * 1e6,
                     "compiled_us": None if compiled_s is None else compiled_s * 1e6, "optional": step.optional})
        progress()
    taken = [r for r in rows if not r["optional"]]
    return {"value_bytes": value_bytes, "records": count, "steps": rows,
            "python_us": sum(r["python_us"] for r in taken),
            "compiled_us": sum(r["compiled_us"] if r["compiled_us"] is not None else r["python_us"] for r in taken)}


def run_produce_path_bench(repeats: int, progress: Callable[[], None],
                           loop_records: int = LOOP_RECORDS) -> dict[str, Any]:
    shapes = [measure_shape(value_bytes, count, repeats, progress, loop_records) for value_bytes, count in SHAPES]
    return {"bench": "produce-path", **provenance(), "machine": machine_info("."), "core": core(),
            "repeats": repeats, "loop_records": loop_records, "shapes": shapes}
