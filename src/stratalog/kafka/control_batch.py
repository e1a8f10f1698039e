"""Transaction markers: the control batches a broker writes into each partition of a transaction when it
ends (KIP-98), in Kafka's record batch format, so that every client reads them as Kafka's.

A marker is a batch of one record, its attributes the transactional and control bits, its producer id and
epoch the transaction's, base sequence -1. The record's key is ``version:int16 type:int16`` (version 0;
type 0 abort, 1 commit) and its value ``version:int16 coordinator_epoch:int32``. Spec:
docs/formats/transactions.md.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from stratalog.kafka.batch_format import (
    CONTROL_BIT,
    HEADER_BYTES,
    LOG_OVERHEAD_BYTES,
    TRANSACTIONAL_BIT,
    BatchHeader,
    KafkaBatchError,
)
from stratalog.kafka.record_check import walk_fields
from stratalog.kafka.records import check_batch, encode_record, packed_batch

#: A control record's key: its version and its type.
CONTROL_KEY = struct.Struct(">hh")
#: A transaction marker's value: its version and the coordinator's epoch.
MARKER_VALUE = struct.Struct(">hi")
CONTROL_KEY_VERSION = 0
MARKER_VALUE_VERSION = 0
#: Base sequence of a batch that no producer numbered.
NO_SEQUENCE = -1


class MarkerType(enum.IntEnum):
    """A control record's type (Kafka's ControlRecordType)."""

    ABORT = 0
    COMMIT = 1


@dataclass(frozen=True, slots=True)
class Marker:
    """One transaction marker, as read back."""

    producer_id: int
    producer_epoch: int
    kind: MarkerType
    coordinator_epoch: int
    timestamp_ms: int


class ControlBatchError(ValueError):
    """A control batch that is not a transaction marker this broker can read."""


def marker_batch(producer_id: int, producer_epoch: int, kind: MarkerType, *, coordinator_epoch: int,
                 timestamp_ms: int, base_offset: int = 0) -> bytes:
    """The control batch that ends a transaction of ``producer_id`` in one partition."""
    key = CONTROL_KEY.pack(CONTROL_KEY_VERSION, kind)
    value = MARKER_VALUE.pack(MARKER_VALUE_VERSION, coordinator_epoch)
    record = encode_record(0, 0, key, value, ())
    return packed_batch(base_offset, -1, CONTROL_BIT | TRANSACTIONAL_BIT, 0, timestamp_ms, timestamp_ms, producer_id,
                        producer_epoch, NO_SEQUENCE, 1, record)


def read_marker(header: BatchHeader, records: bytes | memoryview) -> Marker:
    """The marker of a control batch (``header``, and its records uncompressed: markers are never
    compressed). Raises ControlBatchError for any other control record."""
    if not header.is_control or header.record_count != 1:
        raise ControlBatchError("a transaction marker is a control batch of one record")
    data = bytes(records)
    fields = list(walk_fields(data, 0, 1))
    _, _, _, key_at, key_bytes, value_at, value_bytes, _ = fields[0]
    if key_bytes != CONTROL_KEY.size or value_bytes < MARKER_VALUE.size:
        raise ControlBatchError(f"a control record's key is {CONTROL_KEY.size} bytes and its value at least "
                                f"{MARKER_VALUE.size}; got {key_bytes} and {value_bytes}")
    version, kind = CONTROL_KEY.unpack_from(data, key_at)
    if version != CONTROL_KEY_VERSION or kind not in (MarkerType.ABORT, MarkerType.COMMIT):
        raise ControlBatchError(f"control record version {version}, type {kind}: not a transaction marker")
    _, coordinator_epoch = MARKER_VALUE.unpack_from(data, value_at)
    return Marker(header.producer_id, header.producer_epoch, MarkerType(kind), coordinator_epoch,
                  header.max_timestamp_ms)


def marker_type(batch: bytes | memoryview) -> MarkerType | None:
    """The type of the transaction marker that ``batch`` (a whole stored control batch) is, or None if it
    is another control batch or unreadable: a replay of a log recovers what it can read."""
    view = memoryview(batch)
    try:
        header = check_batch(view, 0, batch_bytes_max=len(view), stored=True)
        return read_marker(header, view[HEADER_BYTES:header.batch_length + LOG_OVERHEAD_BYTES]).kind
    except (KafkaBatchError, ControlBatchError):
        return None
