"""The log APIs but Fetch (api_fetch.py): Produce, ListOffsets, DeleteRecords, InitProducerId.

Produce stores each record batch as it arrived (checked: bounds, magic, CRC, counts; its baseOffset
and, as a Kafka leader does, its partitionLeaderEpoch written) and answers acks=1 and acks=all once the
engine says the batch is durable in the WAL; fetches waiting on its partition are woken. ListOffsets
checks the client's current leader epoch (KIP-320, leader_epochs.py); OffsetForLeaderEpoch is in
api_epochs.py.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from stratalog.broker.acls import Operation, ResourceType
from stratalog.broker.api_txn import refusal, versioned
from stratalog.broker.apis import TRANSACTIONS_REFUSED, Api
from stratalog.broker.leader_epochs import current_epoch, leader_stream, stamped
from stratalog.broker.producers import Verdict
from stratalog.broker.session import Session
from stratalog.broker.topic_configs import COMPACT, config_value, stored_codec
from stratalog.engine import (
    BackpressureError,
    StoreClosedError,
    StoreFailedError,
    StoreFullError,
)
from stratalog.engine.batch import KAFKA_DECOMPRESSED_BYTES_MAX
from stratalog.errors import RecordTooLargeError
from stratalog.kafka.api_keys import ApiKey
from stratalog.kafka.codec import Prebuilt, Request
from stratalog.kafka.fetch_response import READ_COMMITTED, READ_UNCOMMITTED
from stratalog.kafka.produce_request import ProduceBody
from stratalog.kafka.produce_response import ProducePartitionResult, ProduceTopicResult, encode_produce_response
from stratalog.kafka.record_check import check_records, walk_fields
from stratalog.kafka.records import (
    HEADER,
    HEADER_BYTES,
    INT16_MAX,
    BatchHeader,
    Compression,
    KafkaBatchError,
    check_batch,
    recompress,
    uncompressed_records,
)

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker

log = logging.getLogger("stratalog.broker")

#: ListOffsets' special timestamps.
LATEST_TIMESTAMP = -1
EARLIEST_TIMESTAMP = -2
MAX_TIMESTAMP = -3
#: Produce acks: none, the leader's (here: durable in the WAL), all replicas' (the same on one node).
ACKS_NONE = 0
ACKS_ALLOWED = (0, 1, -1)


async def produce(broker: Broker, request: Request, session: Session) -> Prebuilt | None:
    body: ProduceBody = request.body
    acks = body.acks
    timeout_s = min(body.timeout_ms / 1000, broker.config.produce_wait_ms_max / 1000)
    refused = None if body.transactional_id is None else refusal(broker, session, body.transactional_id, "Produce")
    if refused is not None or acks not in ACKS_ALLOWED:
        error = refused if refused is not None else ErrorCode.invalid_required_acks
        message = TRANSACTIONS_REFUSED if refused is not None else f"acks={acks} is not 0, 1 or -1"
        return _produce_response(request, [ProduceTopicResult(name, [
            ProducePartitionResult(index, error, error_message=message) for index, _ in partitions])
            for name, partitions in body.topics])
    unverified = await _verify_first_batches(broker, body)
    pending: list[tuple[ProducePartitionResult, asyncio.Future[int], Any]] = []
    topics = []
    for name, partitions in body.topics:
        results = []
        writable = session.may_topic(Operation.WRITE, name)
        for index, records in partitions:
            response = ProducePartitionResult(index, ErrorCode.none)
            results.append(response)
            if not writable or (name, index) in unverified:
                response.error_code = unverified.get((name, index), ErrorCode.topic_authorization_failed)
                broker.metrics.produce_failed(response.error_code.name)
                continue
            outcome = _append(broker, session, name, index, records, response)
            if outcome is not None:
                pending.append((response, *outcome))
        topics.append(ProduceTopicResult(name, results))
    if acks == ACKS_NONE:
        return None
    if pending:
        futures = [f for _, f, _ in pending]
        done, _ = await asyncio.wait(futures, timeout=timeout_s)
        for response, future, stream in pending:
            if future not in done:
                response.error_code = ErrorCode.request_timed_out
                broker.metrics.produce_failed(response.error_code.name)
                continue
            failure = future.exception()
            if failure is not None:
                # Waited for room past append_wait_s_max (uploads too slow), or the store stopped.
                response.error_code = ErrorCode.request_timed_out if isinstance(failure, BackpressureError) \
                    else ErrorCode.message_too_large if isinstance(failure, RecordTooLargeError) \
                    else ErrorCode.kafka_storage_error
                response.error_message = str(failure)
                broker.metrics.produce_failed(response.error_code.name)
                continue
            response.base_offset = future.result()
            response.log_start_offset = stream.start_offset
    if not _lease_confirmed(broker):
        _withhold_acknowledgements(topics)
    return _produce_response(request, topics)


async def _verify_first_batches(broker: Broker, body: ProduceBody) -> dict[tuple[str, int], ErrorCode]:
    """A broker of a cluster: each transactional batch that would open its transaction in a partition led
    here, checked against the transaction's state first (Transactions.verify); the partitions refused, with
    why. Later batches of a transaction open in the partition, and everything of a broker alone, pass (the
    append's own check covers them)."""
    if not broker.ownership.in_cluster or body.transactional_id is None:
        return {}
    refused: dict[tuple[str, int], ErrorCode] = {}
    for name, partitions in body.topics:
        for index, records in partitions:
            stream = broker.partition(name, index)
            if stream is None or records is None or len(records) < HEADER_BYTES:
                continue   # refused by the append's checks
            header = BatchHeader(*HEADER.unpack_from(records, 0))
            if not header.is_transactional or header.is_control \
                    or broker.partition_txns.open_first_offset(stream.stream_id, header.producer_id) >= 0:
                continue
            error = await broker.transactions.verify(body.transactional_id, header.producer_id,
                                                     header.producer_epoch, name, index)
            if error:
                refused[(name, index)] = error
    return refused


def _lease_confirmed(broker: Broker) -> bool:
    """Whether this broker may answer for what it leads right now: always alone; in a cluster while its
    lease is confirmed (cluster/lease_clock.py). Checked when an answer is complete, so everything in it
    was durable before the lease's confirmation ended, and so in the log any replay of it finds."""
    return broker.ownership.may_acknowledge()


def _withhold_acknowledgements(topics: list[ProduceTopicResult]) -> None:
    """A broker of a cluster whose lease is not confirmed (the database out of reach) acknowledges
    nothing: another broker may replay its log at any moment and miss what it adds. The client
    retries elsewhere (an idempotent producer's retry of a batch that did land is found a duplicate)."""
    for t in topics:
        for p in t.partitions:
            if p.error_code == ErrorCode.none:
                p.error_code = ErrorCode.not_leader_or_follower
                p.error_message = "this broker cannot confirm its lease (the metadata database is out of reach)"
                p.base_offset = -1


def _produce_response(request: Request, topics: list[ProduceTopicResult]) -> Prebuilt:
    # Packed here, not built and written through kio: 2-3 us a response instead of 15-30 us, on every
    # produce (stratalog.kafka.produce_response).
    return Prebuilt([encode_produce_response(request.correlation_id, request.api_version, topics,
                                             throttle_time_ms=request.throttle_ms)], request.throttle_ms)


class _RefusedError(Exception):
    """A partition's batch is refused with this Kafka error."""

    def __init__(self, error: ErrorCode, message: str | None = None) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


def _append(broker: Broker, session: Session, topic_name: str, index: int, records: memoryview | None,
            response: ProducePartitionResult) -> tuple[asyncio.Future[int], Any] | None:
    """Check and append one partition's batch; fill ``response`` with an error, or return the future of
    the batch's base offset and its stream."""
    try:
        return _check_and_append(broker, session, topic_name, index, records)
    except _RefusedError as e:
        response.error_code = e.error
        response.error_message = e.message
        broker.metrics.produce_failed(e.error.name)
        return None


def _check_and_append(broker: Broker, session: Session, topic_name: str, index: int,
                      records: memoryview | None) -> tuple[asyncio.Future[int], Any]:
    validate = broker.config.validate_records
    topic = broker.topics.get(topic_name)
    if topic is None and session.may_create_topic(topic_name):
        topic = broker.auto_create(topic_name)
    stream = broker.partition(topic_name, index) if topic is not None else None
    if stream is None or topic is None:
        raise _RefusedError(ErrorCode(broker.partition_error(topic_name, index)))
    limit = min(int(config_value(topic.configs, "max.message.bytes")), broker.config.message_bytes_max)
    view = records if records is not None else memoryview(b"")
    try:
        header = check_batch(view, 0, batch_bytes_max=limit)
    except KafkaBatchError as e:
        raise _RefusedError(ErrorCode(e.error_code), str(e)) from None
    if header.batch_bytes != len(view):
        raise _RefusedError(ErrorCode.invalid_record, "a produce request carries exactly one record batch per "
                            "partition")
    uncompressed: bytes | memoryview | None = None  # the records, once the check has decompressed them
    if validate:
        try:
            # Bounded as every reader's decompression is: anything stored here, they decode.
            uncompressed = check_records(view, header, decompressed_bytes_max=KAFKA_DECOMPRESSED_BYTES_MAX)
        except KafkaBatchError as e:
            raise _RefusedError(ErrorCode(e.error_code), str(e)) from None
    if header.is_control:
        raise _RefusedError(ErrorCode.invalid_record, "control batches are written by the broker, not produced")
    if header.is_transactional:
        refused = broker.transactions.check_produce(header.producer_id, header.producer_epoch, topic_name, index)
        if refused:
            raise _RefusedError(refused, "the batch's transaction is not ongoing with this partition under this "
                                "producer epoch")
    if COMPACT in config_value(topic.configs, "cleanup.policy") and _has_keyless(view, header, uncompressed):
        # As Kafka: compaction keeps the latest record of each key, and a record without one has none.
        raise _RefusedError(ErrorCode.invalid_record, f"compacted topic {topic_name!r} cannot accept a record "
                            "without a key")
    loop = asyncio.get_running_loop()
    producer_id = header.producer_id
    idempotent = producer_id >= 0
    if idempotent:
        verdict, offset = broker.producers.check(producer_id, header.producer_epoch, stream.stream_id,
                                                 header.base_sequence, header.record_count)
        if verdict is Verdict.DUPLICATE:
            in_flight = broker.producing.get((producer_id, stream.stream_id, header.base_sequence))
            done: asyncio.Future[int] = loop.create_future()
            done.set_result(offset)
            return (in_flight or done), stream
        if verdict is not Verdict.APPEND:
            raise _RefusedError(ErrorCode.invalid_producer_epoch if verdict is Verdict.FENCED
                                else ErrorCode.out_of_order_sequence_number, verdict.value)
    codec = stored_codec(topic.configs)
    if codec is not None and codec != header.compression:
        view, header = _recompressed(view, header, codec, limit, uncompressed)
    history = broker.ownership.epochs(topic_name, index)
    if history:   # as a Kafka leader, the epoch it appends at (a consumer's truncation checks read it)
        view = stamped(view, current_epoch(history))
    # Before the first append since the broker started: nothing of this stream is in flight yet.
    broker.settled_ends.setdefault(stream.stream_id, stream.end_offset)
    try:
        future = broker.appender.append(stream, view, header.record_count, header.max_timestamp_ms)
    except RecordTooLargeError as e:
        raise _RefusedError(ErrorCode.message_too_large, str(e)) from None
    except (StoreFailedError, StoreClosedError, StoreFullError) as e:
        # StoreFullError: the disk is low or object storage full. KAFKA_STORAGE_ERROR is what Kafka answers
        # for an offline log directory, and every client retries it (after a metadata refresh) until its
        # delivery timeout: writes resume here by themselves once space is back.
        raise _RefusedError(ErrorCode.kafka_storage_error, str(e)) from None
    broker.metrics.produced(topic_name, header.record_count, len(view))
    stream_id = stream.stream_id
    if header.is_transactional:
        # Its transaction holds the partition's last stable offset from where the batch can land at the
        # lowest, before the batch is readable (txn_partitions.py).
        broker.partition_txns.began(stream_id, producer_id, stream.end_offset)
    if idempotent:
        key = (producer_id, stream_id, header.base_sequence)
        broker.producers.record(producer_id, header.producer_epoch, stream_id, header.base_sequence,
                                header.record_count, -1)
        broker.producing[key] = future

        def settle(f: asyncio.Future[int]) -> None:
            broker.producing.pop(key, None)
            if f.exception() is None:
                broker.producers.settle(producer_id, stream_id, header.base_sequence, f.result())
            else:
                broker.producers.forget(producer_id, stream_id, header.base_sequence)
        future.add_done_callback(settle)
    count = header.record_count

    def arrived(f: asyncio.Future[int]) -> None:
        # After settle (callbacks run in the order added): the batch is recorded before it counts here.
        if not f.cancelled() and f.exception() is None:
            broker.settled_ends[stream_id] = max(broker.settled_ends.get(stream_id, 0), f.result() + count)
        broker.data_arrived(stream_id)
    future.add_done_callback(arrived)
    return future, stream


def _has_keyless(view: memoryview, header: BatchHeader, records: bytes | memoryview | None) -> bool:
    """Whether a record of the batch has a null key (``records``: its records uncompressed, if the record
    check has them)."""
    try:
        if records is None:
            records = uncompressed_records(view, header, decompressed_bytes_max=KAFKA_DECOMPRESSED_BYTES_MAX)
        return any(key_bytes < 0 for _, _, _, _, key_bytes, _, _, _ in
                   walk_fields(bytes(records), 0, header.record_count))
    except KafkaBatchError as e:
        raise _RefusedError(ErrorCode(e.error_code), str(e)) from None


def _recompressed(view: memoryview, header: BatchHeader, codec: Compression, limit: int,
                  records: bytes | memoryview | None) -> tuple[memoryview, BatchHeader]:
    """The batch in the topic's codec (``compression.type``), within the topic's size bound as Kafka checks
    it after recompressing; ``records``: its records uncompressed, if the record check has them."""
    try:
        batch, header = recompress(view, header, codec, decompressed_bytes_max=KAFKA_DECOMPRESSED_BYTES_MAX,
                                   records=records)
    except KafkaBatchError as e:
        raise _RefusedError(ErrorCode(e.error_code), str(e)) from None
    if len(batch) > limit:
        raise _RefusedError(ErrorCode.message_too_large, f"the batch is {len(batch)} bytes once recompressed with "
                            f"{codec.name.lower()} (the topic's compression.type); at most {limit} are accepted")
    return memoryview(batch), header


# ListOffsets, DeleteRecords ------------------------------------------------------------------------


async def list_offsets(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    committed = getattr(request.body, "isolation_level", READ_UNCOMMITTED) == READ_COMMITTED
    topics = []
    for t in request.body.topics:
        partitions = []
        allowed = session.may_topic(Operation.DESCRIBE, t.name)
        for p in t.partitions:
            # KIP-320 (v4+): the client's current leader epoch is checked first.
            stream, _, refused = leader_stream(broker, t.name, p.partition_index, getattr(
                p, "current_leader_epoch", -1)) if allowed else (None, (), ErrorCode.none)
            entry: dict[str, Any] = {"partition_index": p.partition_index, "error_code": ErrorCode.none,
                                     "timestamp": -1, "offset": -1,
                                     "leader_epoch": broker.leader_epoch(t.name, p.partition_index)}
            partitions.append(entry)
            if not allowed:
                entry["error_code"] = ErrorCode.topic_authorization_failed
                continue
            if stream is None:
                entry["error_code"] = refused
                continue
            ts = p.timestamp
            # What the client may fetch: read_committed ends at the last stable offset. A lookup by time
            # finds a record below it or nothing, as in Kafka (a record of an open transaction is not found).
            fetchable_end = broker.partition_txns.last_stable_offset(stream.stream_id, stream.end_offset) \
                if committed else stream.end_offset
            found: tuple[int, int] | None = None
            if ts == LATEST_TIMESTAMP:
                entry["offset"] = fetchable_end
            elif ts == EARLIEST_TIMESTAMP:
                entry["offset"] = stream.start_offset
            elif ts == MAX_TIMESTAMP:
                found = await asyncio.to_thread(stream.latest_timestamp)
            elif ts < 0:
                entry["error_code"] = ErrorCode.invalid_request
            else:
                found = await asyncio.to_thread(_offset_for_time, stream, ts)
            if found is not None and found[0] < fetchable_end:
                entry["offset"], entry["timestamp"] = found
        topics.append({"name": t.name, "partitions": partitions})
    if not _lease_confirmed(broker):   # an end offset past what a replay of its log would find
        for topic in topics:
            for entry in topic["partitions"]:
                if entry["error_code"] == ErrorCode.none:
                    entry.update(error_code=ErrorCode.not_leader_or_follower, offset=-1, timestamp=-1)
    return {"throttle_time": 0, "topics": topics}


def _offset_for_time(stream: Any, timestamp_ms: int) -> tuple[int, int] | None:
    offset = stream.offset_for_timestamp(timestamp_ms)
    if offset is None:
        return None
    # The timestamp of the very record the lookup found, which may be one of an aborted or open transaction
    # (Kafka's time index has every record too): read_committed would skip it, or stop before it, and ask
    # the loop from this worker thread for nothing.
    records = stream.fetch(offset, offset + 1, max_bytes=1, isolation="read_uncommitted")
    return offset, (records[0].timestamp_ms if records else timestamp_ms)


async def delete_records(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    topics = []
    for t in request.body.topics:
        partitions = []
        allowed = session.may_topic(Operation.DELETE, t.name)
        for p in t.partitions:
            stream = broker.partition(t.name, p.partition_index) if allowed else None
            entry: dict[str, Any] = {"partition_index": p.partition_index, "low_watermark": -1,
                                     "error_code": ErrorCode.none}
            partitions.append(entry)
            if not allowed:
                entry["error_code"] = ErrorCode.topic_authorization_failed
                continue
            if stream is None:
                entry["error_code"] = broker.partition_error(t.name, p.partition_index)
                continue
            target = stream.end_offset if p.offset == -1 else p.offset
            if not 0 <= target <= stream.end_offset:
                entry["error_code"] = ErrorCode.offset_out_of_range
                continue
            await asyncio.to_thread(stream.trim, target)
            entry["low_watermark"] = stream.start_offset
        topics.append({"name": t.name, "partitions": partitions})
    if not _lease_confirmed(broker):   # an end offset past what a replay of its log would find
        for topic in topics:
            for entry in topic["partitions"]:
                if entry["error_code"] == ErrorCode.none:
                    entry.update(error_code=ErrorCode.not_leader_or_follower, offset=-1, timestamp=-1)
    return {"throttle_time": 0, "topics": topics}


# InitProducerId ------------------------------------------------------------------------------------


async def init_producer_id(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    body = request.body
    if body.transactional_id is not None:
        return await _init_transactional(broker, request, session)
    # Kafka's rule: IdempotentWrite on the cluster, or Write on some topic.
    if not (session.may_cluster(Operation.IDEMPOTENT_WRITE) or session.may_some(Operation.WRITE, ResourceType.TOPIC)):
        return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed,
                "producer_id": -1, "producer_epoch": -1}
    given = getattr(body, "producer_id", -1)
    if given >= 0:
        # KIP-360: a producer that lost track of its sequence bumps its epoch and starts again at 0.
        epoch = getattr(body, "producer_epoch", -1) + 1
        if epoch < INT16_MAX:   # an int16 on the wire: at its end, a new producer id instead
            return {"throttle_time": 0, "error_code": ErrorCode.none, "producer_id": given, "producer_epoch": epoch}
    producer_id = await asyncio.to_thread(broker.topics.next_counter, "producer_id")
    return {"throttle_time": 0, "error_code": ErrorCode.none, "producer_id": producer_id, "producer_epoch": 0}


async def _init_transactional(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    """InitProducerId of a transactional producer: the coordinator's (broker/transactions.py)."""
    body = request.body
    txn_id = body.transactional_id
    error = refusal(broker, session, txn_id, "InitProducerId")
    timeout_ms = round(body.transaction_timeout.total_seconds() * 1000)
    if error is None and not 0 < timeout_ms <= broker.config.transaction_timeout_ms_max:
        error = ErrorCode.invalid_transaction_timeout
    if error is not None:
        return {"throttle_time": 0, "error_code": error, "producer_id": -1, "producer_epoch": -1}
    error, producer_id, epoch = await broker.transactions.init_producer_id(
        txn_id, timeout_ms, getattr(body, "producer_id", -1), getattr(body, "producer_epoch", -1))
    return {"throttle_time": 0, "error_code": versioned(error, request), "producer_id": producer_id,
            "producer_epoch": epoch}


APIS = (
    Api(ApiKey.PRODUCE, "Produce", 3, 9, produce),
    Api(ApiKey.LIST_OFFSETS, "ListOffsets", 1, 7, list_offsets),
    Api(ApiKey.DELETE_RECORDS, "DeleteRecords", 0, 2, delete_records, ordered=True),
    Api(ApiKey.INIT_PRODUCER_ID, "InitProducerId", 0, 4, init_producer_id, ordered=True),
)
