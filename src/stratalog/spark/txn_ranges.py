"""The driver asks each partition's leader for its aborted transactions over the offsets a read takes from
objects (StratalogAbortedRanges, kafka/aborted_ranges.py), for read_committed reads of a live broker.

Tasks reading a partition's uploaded records from objects get these ranges with their slices and drop
the batches aborted transactions wrote (spark/aborted.py); the tail, read through Fetch, needs none
(librdkafka drops them as a read_committed consumer). The ranges come from the leader because only it
keeps the partition's transactions (broker/txn_partitions.py); partitions are asked for in one request
per leader (PARTITIONS_MAX at most each), over one connection with the ``kafka.*`` settings. A partition
whose leader moved meanwhile is asked again of its new leader, after fresh metadata, LEADER_LOOKUPS_MAX
times at most. A response with no room for every range (``more``) is followed by a request from past the
last range it listed, until none is left.
"""

from __future__ import annotations

from collections.abc import Callable

from kio.schema.errors import ErrorCode

from stratalog.invariant import invariant
from stratalog.kafka import aborted_ranges as wire
from stratalog.kafka.aborted_ranges import AbortedTxn
from stratalog.kafka.client import BrokerConnectionError, KafkaConnection
from stratalog.kafka.codec import KafkaProtocolError
from stratalog.spark.kafka_client import BrokerReadError, TopicPartition

#: Metadata lookups for a partition whose leader moved while the driver asked: a leader moves once per
#: failover, so a third lookup finding it moved again means the cluster is not settled; the read fails.
LEADER_LOOKUPS_MAX = 3
#: Errors that mean "ask the partition's current leader" (Kafka's, as for Fetch).
_MOVED = frozenset({ErrorCode.not_leader_or_follower, ErrorCode.leader_not_available,
                    ErrorCode.fenced_leader_epoch, ErrorCode.unknown_leader_epoch})

Wanted = dict[TopicPartition, tuple[int, int]]
Leaders = Callable[[list[TopicPartition]], dict[TopicPartition, str]]


def aborted_ranges(leaders: Leaders, settings: dict[str, str],
                   wanted: Wanted) -> dict[TopicPartition, list[AbortedTxn]]:
    """The aborted transactions of each partition overlapping its ``[from, to)`` in ``wanted``, ordered by
    marker. ``leaders`` names each partition's leader (``BrokerView.leaders``). BrokerReadError when a
    leader refuses or cannot be reached."""
    found: dict[TopicPartition, list[AbortedTxn]] = {tp: [] for tp in wanted}
    pending = {tp: span for tp, span in wanted.items() if span[0] < span[1]}
    for _ in range(LEADER_LOOKUPS_MAX):
        if not pending:
            return found
        by_leader: dict[str, Wanted] = {}
        for tp, address in sorted(leaders(sorted(pending)).items()):
            by_leader.setdefault(address, {})[tp] = pending[tp]
        moved: Wanted = {}
        for address, asked in by_leader.items():
            moved.update(_ask_leader(address, settings, asked, found))
        pending = moved
    if pending:
        raise BrokerReadError(f"the leaders of {', '.join(f'{t}/{p}' for t, p in sorted(pending))} moved "
                              f"{LEADER_LOOKUPS_MAX} times while their aborted transactions were asked for")
    return found


def _ask_leader(address: str, settings: dict[str, str], asked: Wanted,
                found: dict[TopicPartition, list[AbortedTxn]]) -> Wanted:
    """Ask one leader for every partition of ``asked``, a page at a time; add the ranges to ``found``. The
    partitions it no longer leads, with what is left to ask of them."""
    moved: Wanted = {}
    try:
        with KafkaConnection(address, settings) as connection:
            while asked:
                chunk = dict(sorted(asked.items())[:wire.PARTITIONS_MAX])
                asked = {tp: span for tp, span in asked.items() if tp not in chunk}
                left, gone = _ask_once(connection, address, chunk, found)
                asked.update(left)
                moved.update(gone)
    except BrokerConnectionError as e:
        raise BrokerReadError(f"asking {address} for aborted transactions: {e}") from e
    return moved


def _ask_once(connection: KafkaConnection, address: str, chunk: Wanted,
              found: dict[TopicPartition, list[AbortedTxn]]) -> tuple[Wanted, Wanted]:
    """One request: (what is left to ask of this leader after a page that was full, what moved away)."""
    topics: dict[str, list[wire.WantedPartition]] = {}
    for (topic, partition), (start, end) in sorted(chunk.items()):
        topics.setdefault(topic, []).append(wire.WantedPartition(partition, start, end))
    request = wire.AbortedRangesRequest(tuple((t, tuple(ps)) for t, ps in topics.items()))
    correlation_id = connection.next_correlation_id()
    try:
        answered, response = wire.decode_response(connection.exchange(
            wire.encode_request(correlation_id, connection.client_id, request)))
    except KafkaProtocolError as e:
        raise BrokerReadError(f"{address} answered {wire.API_NAME} with bytes that are not a response: {e}") from e
    if answered != correlation_id:
        raise BrokerReadError(f"{address} answered request {answered}, not {correlation_id}")
    if response.error_code != ErrorCode.none:
        raise BrokerReadError(f"{address} refused {wire.API_NAME} (error {response.error_code}): "
                              f"{response.error_message}")
    left: Wanted = {}
    moved: Wanted = {}
    for topic, partitions in response.topics:
        for p in partitions:
            tp = (topic, p.partition)
            if tp not in chunk:
                raise BrokerReadError(f"{address} answered for {topic}/{p.partition}, which was not asked")
            start, end = chunk[tp]
            if p.error_code in _MOVED:
                moved[tp] = (start, end)
                continue
            if p.error_code != ErrorCode.none:
                raise BrokerReadError(f"{address}: the aborted transactions of {topic}/{p.partition}: "
                                      f"{_error_name(p.error_code)}")
            found[tp].extend(r for r in p.ranges if not found[tp] or r > found[tp][-1])
            if p.more:
                after = p.ranges[-1].last_offset + 1 if p.ranges else start
                invariant(after >= start, "a page of aborted ranges ends after where it was asked from")
                left[tp] = (after, end)
    return left, moved


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"error {code}"
