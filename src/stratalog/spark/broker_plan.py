"""Reading a live broker: uploaded offsets from objects, the rest from the broker, with one seam per partition.

The driver asks the broker for each partition's next offset (its high watermark: every record below it
is acknowledged), then reads the manifest. For a partition to be read up to ``end``, offsets below the
manifest's end for its stream are in objects, and ``[max(start, manifest end), end)`` is read from the
broker with Kafka Fetch (:class:`TailPartition`). The seam is exact whatever happens during the read:
the broker serves every offset it holds, uploaded or not, so the tail task may find its records
uploaded meanwhile and still gets them; an object merged away is planned again from the newest
manifest (reader.py). The one change that removes records is a trim (retention, DeleteRecords): the
read then fails with DataLossError, or with ``failOnDataLoss=false`` goes on without them.

A stream of the broker is named ``<topic>/<partition>``, which is the ``stream`` column's value.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from stratalog.engine.manifest import Manifest
from stratalog.spark.kafka_client import DataLossError, PartitionEnds, TopicPartition
from stratalog.spark.plan import OffsetRange, ReadPartition, plan_partitions


@dataclass(frozen=True, slots=True)
class TailPartition:
    """One task's read from the broker: offsets ``[start, end)`` of a topic's partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def rows(self) -> int:
        return self.end - self.start


def label(tp: TopicPartition) -> str:
    return f"{tp[0]}/{tp[1]}"


def read_ranges(ends: dict[TopicPartition, PartitionEnds], offsets: OffsetRange | None = None,
                labels: frozenset[str] | None = None,
                starts: dict[TopicPartition, int] | None = None) -> dict[TopicPartition, tuple[int, int]]:
    """What a batch read covers: each partition from its start (or ``starts``, when later) to its high
    watermark, narrowed by the pushed-down filters on ``offset`` and ``stream``."""
    offsets = offsets or OffsetRange()
    out = {}
    for tp, e in sorted(ends.items()):
        if labels is not None and label(tp) not in labels:
            continue
        start = max(e.start, offsets.start, (starts or {}).get(tp, 0))
        end = min(e.end, offsets.end)
        if start < end:
            out[tp] = (start, end)
    return out


def plan_broker_read(manifest: Manifest | None, ranges: dict[TopicPartition, tuple[int, int]], *,
                     rows_max: int, bytes_max: int, fail_on_data_loss: bool = True,
                     time_from_ms: int | None = None) -> list[ReadPartition | TailPartition]:
    """Tasks reading ``ranges`` (partition -> [start, end)): object reads planned from ``manifest`` for
    the uploaded part (None: everything from the broker), then broker reads of at most ``rows_max``
    records each for the rest.

    A range starting below what the manifest still holds lost records to a trim: DataLossError, or
    with ``fail_on_data_loss`` False the range starts where the stream now does.
    """
    by_name = {} if manifest is None else {s.name: s for s in manifest.streams.values() if s.name is not None}
    starts: dict[int, int] = {}
    ends: dict[int, int] = {}
    tails: list[TailPartition] = []
    for tp, (wanted, end) in sorted(ranges.items()):
        start = wanted
        info = by_name.get(label(tp))
        seam = start
        if info is not None and info.end_offset > start:
            if start < info.start_offset:
                if fail_on_data_loss:
                    raise DataLossError(f"{label(tp)}: offsets {start} to {info.start_offset - 1} were trimmed "
                                        "before they were read; set failOnDataLoss=false to read on")
                start = info.start_offset
            seam = max(start, min(info.end_offset, end))
            if seam > start:
                starts[info.stream_id], ends[info.stream_id] = start, seam
        for first in range(seam, end, rows_max):
            tails.append(TailPartition(tp[0], tp[1], first, min(first + rows_max, end)))
    cold: Sequence[ReadPartition] = []
    if manifest is not None and starts:
        cold = plan_partitions(manifest, sorted(starts), rows_max=rows_max, bytes_max=bytes_max, starts=starts,
                               ends=ends, time_from_ms=time_from_ms)
    return [*cold, *tails]
