"""The driver asks each partition's leader for its aborted transactions over the offsets a read takes from
objects (StratalogAbortedRanges, kafka/aborted_ranges.py), for read_committed reads of a live broker.

Tasks reading a partition's uploaded records from objects get these ranges with their slices and drop
the batches aborted transactions wrote (spark/aborted.py); the tail, read through Fetch, needs none
(librdkafka drops them as a read_committed consumer). The ranges come from the leader because only it
keeps the partition's transactions (broker/txn_partitions.py); partitions are asked for in one request
per leader (PARTITIONS_MAX at most each), over one connection with the ``kafka.*`` settings. A partition
whose leader moved meanwhile is asked again of its new leader, after fresh metadata, LEADER_LOOKUPS_MAX
times at most; a leader that cannot be reached is asked again after fresh metadata, with a wait, for as
long as the caller allows (the data source: a failover's length). A response with no room for every range
(``more``) is followed by a request from past the last range it listed, until none is left.

A range missed would let a task return an aborted transaction's records, so an answer is taken only
whole and consistent (``read_page``, no I/O): every partition asked answered once, none other, each
one's ranges in marker order and overlapping what was asked, a page with ``more`` that moves on. A
broker that answers otherwise, or bytes that are no answer, fail the read with BrokerReadError, never
with another exception (the fuzz target ``spark_aborted_ranges`` holds it to that).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol

from kio.schema.errors import ErrorCode

from stratalog.invariant import invariant
from stratalog.kafka import aborted_ranges as wire
from stratalog.kafka.aborted_ranges import AbortedTxn
from stratalog.kafka.client import BrokerConnectionError, KafkaConnection
from stratalog.kafka.codec import KafkaProtocolError
from stratalog.kafka.records import INT64_MAX
from stratalog.spark.kafka_client import BrokerReadError, TopicPartition

#: Metadata lookups for a partition whose leader moved while the driver asked: a leader moves once per
#: failover, so a third lookup finding it moved again means the cluster is not settled; the read fails.
LEADER_LOOKUPS_MAX = 3
#: The first wait before asking again after a leader could not be reached (or none was named), doubled up to
#: UNREACHABLE_WAIT_S_MAX: a failover takes seconds (docs/cluster.md), a handoff less than one.
UNREACHABLE_WAIT_S = 0.2
UNREACHABLE_WAIT_S_MAX = 2.0
#: Errors that mean "ask the partition's current leader" (Kafka's, as for Fetch).
_MOVED = frozenset({ErrorCode.not_leader_or_follower, ErrorCode.leader_not_available,
                    ErrorCode.fenced_leader_epoch, ErrorCode.unknown_leader_epoch})

#: Each partition's offsets still to ask for: ``(from, to)``, ``from`` past the ranges found so far.
Wanted = dict[TopicPartition, tuple[int, int]]
Leaders = Callable[[list[TopicPartition]], dict[TopicPartition, str]]


class Connection(Protocol):
    """What the client needs of a connection to a broker (kafka/client.py's KafkaConnection)."""

    client_id: str

    def next_correlation_id(self) -> int: ...

    def exchange(self, frame: bytes) -> bytes:
        """Send a request frame; the response frame without its size. BrokerConnectionError if it fails."""
        ...


#: Opens a connection to ``host:port`` with the ``kafka.*`` settings (BrokerConnectionError if it cannot).
Connect = Callable[[str, dict[str, str]], AbstractContextManager[Connection]]


@dataclass
class Page:
    """What one response said: new ranges by partition, what is left to ask of the same leader (a page that
    was full), and what to ask of a partition's new leader."""

    found: dict[TopicPartition, list[AbortedTxn]] = field(default_factory=dict)
    left: Wanted = field(default_factory=dict)
    moved: Wanted = field(default_factory=dict)


def aborted_ranges(leaders: Leaders, settings: dict[str, str], wanted: Wanted,
                   connect: Connect = KafkaConnection, *, unreachable_s_max: float = 0.0,
                   sleep: Callable[[float], None] = time.sleep,
                   clock: Callable[[], float] = time.monotonic) -> dict[TopicPartition, list[AbortedTxn]]:
    """The aborted transactions of each partition overlapping its ``[from, to)`` in ``wanted``, ordered by
    marker. ``leaders`` names each partition's leader (``BrokerView.leaders``). BrokerReadError when a
    leader refuses, or answers with anything but a whole, consistent answer; and when a leader cannot be
    reached (nor metadata name one), once ``unreachable_s_max`` has passed: until then the partitions are
    asked again of the leader fresh metadata names, after a wait (a broker killed in a cluster is replaced
    within seconds)."""
    found: dict[TopicPartition, list[AbortedTxn]] = {tp: [] for tp in wanted}
    pending = {tp: span for tp, span in wanted.items() if span[0] < span[1]}
    deadline = clock() + unreachable_s_max
    wait_s = UNREACHABLE_WAIT_S
    moves = 0
    while pending:
        try:
            where = leaders(sorted(pending))
        except BrokerReadError:
            if clock() + wait_s > deadline:
                raise
            sleep(wait_s)   # no leader named yet: a failover under way
            wait_s = min(wait_s * 2, UNREACHABLE_WAIT_S_MAX)
            continue
        invariant(set(where) >= set(pending), "leaders() names a leader for every partition or raises")
        by_leader: dict[str, Wanted] = {}
        for tp in sorted(pending):
            by_leader.setdefault(where[tp], {})[tp] = pending[tp]
        moved: Wanted = {}
        unreachable: Wanted = {}
        for address, asked in by_leader.items():
            try:
                moved.update(_ask_leader(address, settings, asked, found, connect))
            except _UnreachableError as e:
                if clock() + wait_s > deadline:
                    raise BrokerReadError(f"asking {address} for aborted transactions: {e}") from e
                unreachable.update(e.left)
        if moved:
            moves += 1
            if moves >= LEADER_LOOKUPS_MAX:
                raise BrokerReadError(f"the leaders of {', '.join(f'{t}/{p}' for t, p in sorted(moved))} moved "
                                      f"{LEADER_LOOKUPS_MAX} times while their aborted transactions were asked for")
        if unreachable:
            sleep(wait_s)
            wait_s = min(wait_s * 2, UNREACHABLE_WAIT_S_MAX)
        pending = {**moved, **unreachable}
    return found


class _UnreachableError(Exception):
    """A leader's connection failed; ``left``: what is still to ask of its partitions."""

    def __init__(self, error: BrokerConnectionError, left: Wanted) -> None:
        super().__init__(str(error))
        self.left = left


def _ask_leader(address: str, settings: dict[str, str], asked: Wanted,
                found: dict[TopicPartition, list[AbortedTxn]], connect: Connect) -> Wanted:
    """Ask one leader for every partition of ``asked``, a page at a time; add the ranges to ``found``. The
    partitions it no longer leads, with what is left to ask of them. _UnreachableError, with what is left
    to ask, when the connection fails: a page not answered is asked again whole, so no range is taken
    twice nor missed."""
    moved: Wanted = {}
    chunk: Wanted = {}
    try:
        with connect(address, settings) as connection:
            while asked:
                chunk = dict(sorted(asked.items())[:wire.PARTITIONS_MAX])
                asked = {tp: span for tp, span in asked.items() if tp not in chunk}
                correlation_id = connection.next_correlation_id()
                answer = connection.exchange(wire.encode_request(correlation_id, connection.client_id,
                                                                 page_request(chunk)))
                page = read_page(address, chunk, correlation_id, answer)
                chunk = {}
                for tp, ranges in page.found.items():
                    found[tp].extend(ranges)
                asked.update(page.left)
                moved.update(page.moved)
    except BrokerConnectionError as e:
        raise _UnreachableError(e, {**asked, **chunk, **moved}) from e
    return moved


def page_request(chunk: Wanted) -> wire.AbortedRangesRequest:
    """The request for the partitions of ``chunk`` (PARTITIONS_MAX at most), by topic."""
    invariant(len(chunk) <= wire.PARTITIONS_MAX, f"{len(chunk)} partitions in one request")
    topics: dict[str, list[wire.WantedPartition]] = {}
    for (topic, partition), (start, end) in sorted(chunk.items()):
        topics.setdefault(topic, []).append(wire.WantedPartition(partition, start, end))
    return wire.AbortedRangesRequest(tuple((t, tuple(ps)) for t, ps in topics.items()))


def read_page(address: str, chunk: Wanted, correlation_id: int, frame: bytes) -> Page:
    """The answer ``address`` gave (``frame``, without its size) to the request for ``chunk``. BrokerReadError
    for bytes that are not a response, an error, or an answer that is not whole and consistent."""
    try:
        answered, response = wire.decode_response(frame)
    except KafkaProtocolError as e:
        raise BrokerReadError(f"{address} answered {wire.API_NAME} with bytes that are not a response: {e}") from e
    if answered != correlation_id:
        raise BrokerReadError(f"{address} answered request {answered}, not {correlation_id}")
    if response.error_code != ErrorCode.none:
        raise BrokerReadError(f"{address} refused {wire.API_NAME} (error {response.error_code}): "
                              f"{response.error_message}")
    page = Page()
    for topic, partitions in response.topics:
        for p in partitions:
            tp = (topic, p.partition)
            if tp not in chunk or tp in page.found or tp in page.moved:
                raise BrokerReadError(f"{address} answered for {topic}/{p.partition}, which was not asked "
                                      "or was answered already")
            if p.error_code in _MOVED:
                page.moved[tp] = chunk[tp]
            elif p.error_code != ErrorCode.none:
                raise BrokerReadError(f"{address}: the aborted transactions of {topic}/{p.partition}: "
                                      f"{_error_name(p.error_code)}")
            else:
                page.found[tp] = _ranges(address, tp, chunk[tp], p)
                if p.more:
                    page.left[tp] = _next_from(address, tp, chunk[tp], p.ranges)
    unanswered = sorted(set(chunk) - set(page.found) - set(page.moved))
    if unanswered:
        raise BrokerReadError(f"{address} did not answer for {', '.join(f'{t}/{p}' for t, p in unanswered)}")
    if page.left == chunk:
        # Every partition said ``more`` and listed nothing: asking again would get the same answer forever.
        raise BrokerReadError(f"{address} listed no range and said there were more, for every partition asked")
    return page


def _ranges(address: str, tp: TopicPartition, span: tuple[int, int],
            answer: wire.PartitionRanges) -> list[AbortedTxn]:
    """A partition's ranges, refused unless each overlaps ``span`` (as the request selects them) and they
    come in strictly rising marker order (one marker per offset): so pages never repeat nor skip one."""
    start, end = span
    last = start - 1
    for r in answer.ranges:
        if not (last < r.last_offset and r.first_offset < end and r.first_offset <= r.last_offset):
            raise BrokerReadError(f"{address}: {tp[0]}/{tp[1]}'s aborted range {r} is out of order or does not "
                                  f"reach [{start}, {end}) as asked")
        last = r.last_offset
    return list(answer.ranges)


def _next_from(address: str, tp: TopicPartition, span: tuple[int, int],
               ranges: tuple[AbortedTxn, ...]) -> tuple[int, int]:
    """Where to ask from after a page that said ``more``: past its last range (it may be past ``span``'s end:
    the request's rule still selects the rest), or where it was asked from when it had no room for any."""
    if not ranges:
        return span
    if ranges[-1].last_offset >= INT64_MAX:
        raise BrokerReadError(f"{address} said {tp[0]}/{tp[1]} has more aborted ranges after one ending at the "
                              "last offset there is")
    return ranges[-1].last_offset + 1, span[1]


def _error_name(code: int) -> str:
    try:
        return ErrorCode(code).name
    except ValueError:
        return f"error {code}"
