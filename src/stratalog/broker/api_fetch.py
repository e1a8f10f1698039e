"""The Fetch API: stored batches returned whole, within the request's bounds, in fetch sessions.

A fetch goes through the session cache first (fetch_sessions.py, KIP-227): it says which partitions this
fetch reads (those it names, or its session's) and, once they are read, which the answer carries and under
which session id. Between the two, each partition is read: Kafka batches as they were produced, batches
appended through the Python API encoded as Kafka batches on the way out; from the log cache on the loop,
or from objects in a worker thread. A fetch with less than ``min_bytes`` waits for the next durable
append to one of its partitions (api_log.py's Produce wakes it), up to its wait.

Topics are named by name up to Fetch v12 and by topic id from v13 (KIP-516): an id this broker does not
know is answered UNKNOWN_TOPIC_ID. From v9 each partition carries the client's current leader epoch,
checked as Kafka checks it (leader_epochs.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from stratalog.broker.acls import Operation
from stratalog.broker.apis import Api
from stratalog.broker.fetch_sessions import FINAL_EPOCH, Key, Kind, Outcome, Wanted
from stratalog.broker.leader_epochs import leader_stream
from stratalog.broker.quotas import CONSUMER_BYTE_RATE
from stratalog.broker.session import Session
from stratalog.engine import OffsetOutOfRangeError, StoreClosedError, StoreFailedError
from stratalog.engine.batch import ENCODING_KAFKA, StoredBatch, stored_records
from stratalog.kafka.api_keys import ApiKey
from stratalog.kafka.codec import Prebuilt, Request
from stratalog.kafka.fetch_response import (
    FETCH_VERSION_MAX,
    FETCH_VERSION_MIN,
    NO_TOPIC_ID,
    NODE_ENDPOINTS_VERSION,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    TOPIC_ID_VERSION,
    AbortedTransaction,
    FetchPartitionResult,
    FetchTopicResult,
    NodeEndpoint,
    encode_fetch_response,
)
from stratalog.kafka.records import encode_batch

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker

#: The errors whose partitions name their current leader from v16 (Kafka's rule, KIP-951).
SENT_ELSEWHERE = frozenset((ErrorCode.not_leader_or_follower, ErrorCode.fenced_leader_epoch))
#: A fetch refused for lack of response memory waits at most this long (its own wait, if shorter) before
#: it answers with no records.
MEMORY_WAIT_S_MAX = 0.5



def as_kafka_batch(batch: StoredBatch) -> bytes | memoryview:
    """A stored batch as Kafka consumers read it: Kafka batches as stored, native ones encoded."""
    if batch.encoding == ENCODING_KAFKA:
        return batch.body
    return encode_batch(list(stored_records(batch)), base_offset=batch.base_offset)


@dataclass(frozen=True, slots=True)
class _Target:
    """One partition a fetch reads: the session's key for it, its topic's name (None: an id not known
    here) and id, and what the fetch asks of it."""

    key: Key
    topic: str | None
    topic_id: uuid.UUID
    partition: int
    wanted: Wanted


async def fetch(broker: Broker, request: Request, session: Session) -> Prebuilt:
    body = request.body
    by_id = request.api_version >= TOPIC_ID_VERSION
    sessions = broker.fetch_sessions
    plan = sessions.begin(getattr(body, "session_id", 0), getattr(body, "session_epoch", FINAL_EPOCH), by_id,
                          _wanted(body, by_id), _forgotten(body, by_id), time.monotonic())
    if plan.kind is Kind.REFUSED:
        return _response(request, plan.error_code, 0, [], request.throttle_ms)
    targets = [_target(broker, key, wanted, by_id) for key, wanted in plan.partitions]
    results, topic_bytes = await _read_waiting(broker, body, targets, session)
    if not broker.ownership.may_acknowledge():
        # Records made durable after the lease's confirmation ended may be missing from the replay that
        # another broker makes of this one's log: a consumer that read them would skip the records the new
        # leader writes at their offsets.
        results = [FetchPartitionResult(t.partition, ErrorCode.not_leader_or_follower, -1) for t in targets]
        topic_bytes = {}
    endpoints: list[NodeEndpoint] = []
    if request.api_version >= NODE_ENDPOINTS_VERSION:
        results, endpoints = _leaders_named(broker, session, targets, results)
    answer = sessions.finish(plan, [_outcome(r) for r in results], time.monotonic())
    for topic, (size_bytes, records_out) in topic_bytes.items():
        broker.metrics.fetched(topic, size_bytes, records_out)
    total = sum(size for size, _ in topic_bytes.values())
    fetch_throttle_ms = broker.quotas.record(session.user, request.client_id or "", CONSUMER_BYTE_RATE, total)
    if fetch_throttle_ms:
        broker.metrics.throttled(session.user, request.client_id or "", fetch_throttle_ms)
    topics = list(_grouped(targets, results, answer.included))
    return _response(request, answer.error_code, answer.session_id, topics,
                     max(request.throttle_ms, fetch_throttle_ms), endpoints)


def _response(request: Request, error_code: int, session_id: int, topics: Sequence[FetchTopicResult],
              throttle_ms: int, endpoints: Sequence[NodeEndpoint] = ()) -> Prebuilt:
    # Encoded here, not by kio: the records stay views of the stored batches up to the socket.
    return Prebuilt(encode_fetch_response(request.correlation_id, request.api_version, throttle_time_ms=throttle_ms,
                                          error_code=error_code, session_id=session_id, topics=topics,
                                          node_endpoints=endpoints), throttle_ms)


def _leaders_named(broker: Broker, session: Session, targets: Sequence[_Target],
                   results: list[FetchPartitionResult]) -> tuple[list[FetchPartitionResult], list[NodeEndpoint]]:
    """KIP-951 (v16+): a partition that sends the client elsewhere names its current leader and epoch, and
    the response where each such leader listens, so the client goes there without asking for metadata."""
    named: list[FetchPartitionResult] = []
    leaders: set[int] = set()
    for target, result in zip(targets, results, strict=True):
        led = None
        if result.error_code in SENT_ELSEWHERE and target.topic is not None:
            led = broker.ownership.leader(target.topic, target.partition)
        if led is None:
            named.append(result)
            continue
        leaders.add(led[0])
        named.append(dataclasses.replace(result, current_leader=led))
    endpoints = [NodeEndpoint(b.broker_id, b.host, b.port) for b in broker.ownership.brokers(session.listener)
                 if b.broker_id in leaders]
    return named, endpoints


def _wanted(body: Any, by_id: bool) -> dict[Key, Wanted]:
    """The partitions a fetch names, in its order (one named twice: the last parameters, the first place)."""
    wanted: dict[Key, Wanted] = {}
    for t in body.topics:
        name = t.topic_id if by_id else t.topic
        for p in t.partitions:
            wanted[(name, p.partition)] = Wanted(p.fetch_offset, p.partition_max_bytes,
                                                 getattr(p, "current_leader_epoch", -1))
    return wanted


def _forgotten(body: Any, by_id: bool) -> Iterator[Key]:
    for t in getattr(body, "forgotten_topics_data", ()):
        name = t.topic_id if by_id else t.topic
        for partition in t.partitions:
            yield name, partition


def _target(broker: Broker, key: Key, wanted: Wanted, by_id: bool) -> _Target:
    named, partition = key
    if by_id:
        # kio reads the all-zero id as None: no topic has it.
        topic_id = named if isinstance(named, uuid.UUID) else NO_TOPIC_ID
        topic = broker.topics.by_id(topic_id)
        return _Target(key, None if topic is None else topic.name, topic_id, partition, wanted)
    return _Target(key, str(named), NO_TOPIC_ID, partition, wanted)


def _outcome(result: FetchPartitionResult) -> Outcome:
    return Outcome(result.error_code, result.high_watermark, result.log_start_offset, bool(result.records))


def _grouped(targets: Sequence[_Target], results: Sequence[FetchPartitionResult],
             included: Sequence[bool]) -> Iterator[FetchTopicResult]:
    """The answer's topics: each run of partitions of one topic, in the order read (Kafka's grouping)."""
    run: list[FetchPartitionResult] = []
    current: _Target | None = None
    for target, result, carried in zip(targets, results, included, strict=True):
        if not carried:
            continue
        if current is not None and target.key[0] != current.key[0]:
            yield FetchTopicResult(current.topic or "", run, current.topic_id)
            run = []
        current = target
        run.append(result)
    if current is not None:
        yield FetchTopicResult(current.topic or "", run, current.topic_id)


# Reading -------------------------------------------------------------------------------------------


async def _read_waiting(broker: Broker, body: Any, targets: Sequence[_Target],
                        session: Session) -> tuple[list[FetchPartitionResult], dict[str, tuple[int, int]]]:
    """Every target read, waiting (up to the fetch's wait) while they hold less than ``min_bytes``: the
    results, and the record bytes and records sent of each topic that has some."""
    wait_s = min(body.max_wait.total_seconds(), broker.config.fetch_wait_ms_max / 1000)
    deadline = time.monotonic() + wait_s
    response_max = min(getattr(body, "max_bytes", 2**31 - 1), broker.config.fetch_response_bytes_max)
    min_bytes = body.min_bytes
    denied = {t.topic for t in targets if t.topic is not None and not session.may_topic(Operation.READ, t.topic)}
    room = broker.response_memory.left_bytes()
    if room < response_max:
        # Responses written and not yet taken by their clients fill the budget: answer with what fits,
        # and with no records at all (after the wait, so the client does not spin) when nothing does.
        broker.metrics.bound_reached("response_memory_bytes_max")
        response_max = room
        if room <= 0:
            await asyncio.sleep(min(wait_s, MEMORY_WAIT_S_MAX))
    # Kafka's bound (from Fetch v3): the records of a response fit max_bytes, and a partition's its
    # partition_max_bytes, except the first batch of the first partition that has one, which goes whole
    # (a consumer always progresses); when the response budget is spent, not even that one.
    one_over = room > 0
    # read_committed (v4+): records up to each partition's last stable offset, with its aborted ranges.
    committed = getattr(body, "isolation_level", READ_UNCOMMITTED) == READ_COMMITTED
    while True:
        results, topic_bytes, waiting_on = await _fetch_once(broker, targets, response_max, one_over, denied,
                                                             committed)
        total = sum(size for size, _ in topic_bytes.values())
        remaining_s = deadline - time.monotonic()
        if total >= min_bytes or remaining_s <= 0 or not waiting_on or broker.stopping:
            return results, topic_bytes
        await broker.wait_for_data(waiting_on, remaining_s)
        if time.monotonic() >= deadline:
            results, topic_bytes, _ = await _fetch_once(broker, targets, response_max, one_over, denied, committed)
            return results, topic_bytes


async def _fetch_once(broker: Broker, targets: Sequence[_Target], response_max: int, one_over: bool,
                      denied: set[str], committed: bool,
                      ) -> tuple[list[FetchPartitionResult], dict[str, tuple[int, int]], list[int]]:
    """Each target's result, the record bytes and records sent of each topic that has some, and the
    streams with nothing past the offset asked (a fetch that waits waits on them). ``committed``: up to
    the last stable offset only, with the aborted transactions of what is sent."""
    total = 0
    topic_bytes: dict[str, tuple[int, int]] = {}
    waiting_on: list[int] = []
    results = []
    for target in targets:
        topic, index = target.topic, target.partition
        if topic is None:
            results.append(FetchPartitionResult(index, ErrorCode.unknown_topic_id, -1))
            continue
        if topic in denied:
            results.append(FetchPartitionResult(index, ErrorCode.topic_authorization_failed, -1))
            continue
        stream, _, refused = leader_stream(broker, topic, index, target.wanted.current_leader_epoch)
        if stream is None:
            results.append(FetchPartitionResult(index, refused, -1))
            continue
        high, start = stream.end_offset, stream.start_offset
        stable = broker.partition_txns.last_stable_offset(stream.stream_id, high)
        end = stable if committed else high
        error = ErrorCode.none
        # The stored batches, each whole, as views of the engine's immutable bytes (LogCache entries,
        # cached blocks): never joined, so a fetch copies no record byte before the socket.
        records: list[bytes | memoryview] = []
        offset = target.wanted.fetch_offset
        budget = min(target.wanted.partition_max_bytes, response_max - total)
        first = one_over and not total  # clients drop a response over their bound: never two over
        sent_records = 0
        sent_end = offset
        if offset >= end and offset <= high:
            waiting_on.append(stream.stream_id)
        elif budget > 0 or first:
            try:
                batches = await _read(stream, offset, max(budget, 0), first)
                if committed:
                    batches = [b for b in batches if b.base_offset < stable]
                records = _within([as_kafka_batch(b) for b in batches], budget, first)
                sent_end = batches[len(records) - 1].end_offset if records else offset
                sent_records = sum(b.count for b in batches[:len(records)])
            except OffsetOutOfRangeError:
                error = ErrorCode.offset_out_of_range
            except (StoreFailedError, StoreClosedError):
                error = ErrorCode.kafka_storage_error
        aborted = [AbortedTransaction(r.producer_id, r.first_offset) for r in
                   broker.partition_txns.aborted_ranges(stream.stream_id, offset, sent_end)] if committed else None
        results.append(FetchPartitionResult(index, error, high, last_stable_offset=stable, log_start_offset=start,
                                            aborted_transactions=aborted, records=records))
        if records:
            size_bytes = sum(len(r) for r in records)
            total += size_bytes
            sent_bytes, records_before = topic_bytes.get(topic, (0, 0))
            topic_bytes[topic] = (sent_bytes + size_bytes, records_before + sent_records)
    return results, topic_bytes, waiting_on


def _within(batches: list[bytes | memoryview], budget: int, first: bool) -> list[bytes | memoryview]:
    """The leading batches that fit ``budget`` (the first whatever its size when ``first``): a batch
    appended through the Python API is larger once encoded as Kafka's than the store counted it."""
    used = 0
    for i, batch in enumerate(batches):
        used += len(batch)
        if used > budget and (i or not first):
            return batches[:i]
    return batches


async def _read(stream: Any, offset: int, max_bytes: int, at_least_one: bool) -> list[StoredBatch]:
    if offset >= stream.uploaded_end_offset:
        return list(stream.fetch_batches(offset, max_bytes, at_least_one=at_least_one))  # in memory: no hop
    return list(await asyncio.to_thread(functools.partial(stream.fetch_batches, offset, max_bytes,
                                                          at_least_one=at_least_one)))


APIS = (
    Api(ApiKey.FETCH, "Fetch", FETCH_VERSION_MIN, FETCH_VERSION_MAX, fetch),
)
