"""StratalogAbortedRanges: the aborted transactions of partitions over offset ranges, from their leader.

A Spark read of a live broker reads uploaded records from objects (spark/broker_plan.py); to read them as
read_committed, its driver asks each partition's leader which producers' batches aborted transactions
wrote among the offsets it plans to read, and each task drops those batches (spark/aborted.py). Fetch
tells a consumer the same for what it sends; nothing in Kafka's protocol tells it for a range read
elsewhere, so the broker serves this request of its own (kafka/aborted_ranges.py has the wire format).

The answer comes from the partition's transactions as its leader keeps them (broker/txn_partitions.py,
read only): the ranges overlapping the offsets asked (a marker at or after ``from_offset``, a first batch
before ``to_offset``; a page's continuation may start past ``to_offset``), and the last stable offset.
Every range that ends below the last stable offset is durable before it is listed, and no transaction
with a batch below it is open, so what is listed below the last stable offset a reader saw never changes
after. The decoder has refused a request of more than PARTITIONS_MAX partitions (the connection closes:
only stratalog's client sends this request, and it splits); the response holds RANGES_MAX ranges at most,
shared by its partitions in the order asked.

Each topic needs Read, as Fetch would (its records are what the ranges describe): a partition of a
topic the principal may not read answers TOPIC_AUTHORIZATION_FAILED, and nothing else about it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from stratalog.broker.acls import Operation
from stratalog.broker.apis import Api
from stratalog.broker.leader_epochs import leader_stream
from stratalog.broker.session import Session
from stratalog.broker.txn_partitions import AbortedRange
from stratalog.invariant import invariant
from stratalog.kafka.aborted_ranges import (
    API_KEY,
    API_NAME,
    PARTITIONS_MAX,
    RANGES_MAX,
    AbortedRangesRequest,
    AbortedRangesResponse,
    AbortedTxn,
    PartitionRanges,
    WantedPartition,
    encode_response,
)
from stratalog.kafka.codec import Prebuilt, Request

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker

#: The client gives no leader epoch: the request answers for the partition as this broker leads it now.
NO_LEADER_EPOCH = -1


def _answer(request: Request, response: AbortedRangesResponse) -> Prebuilt:
    return Prebuilt([encode_response(request.correlation_id, response)], request.throttle_ms)


class _Budget:
    """Ranges left for the response (RANGES_MAX): a partition that finds it spent says ``more``."""

    def __init__(self) -> None:
        self.left = RANGES_MAX

    def take(self, ranges: list[AbortedRange]) -> tuple[tuple[AbortedTxn, ...], bool]:
        taken = tuple(AbortedTxn(r.last_offset, r.producer_id, r.first_offset) for r in ranges[:self.left])
        self.left -= len(taken)
        return taken, len(taken) < len(ranges)


def _partition(broker: Broker, topic: str, wanted: WantedPartition, budget: _Budget) -> PartitionRanges:
    def refused(code: ErrorCode) -> PartitionRanges:
        return PartitionRanges(wanted.partition, int(code), -1, False, ())

    # from_offset past to_offset is a page's continuation (kafka/aborted_ranges.py), not an error.
    if wanted.from_offset < 0 or wanted.to_offset < 0:
        return refused(ErrorCode.invalid_request)
    stream, _, error = leader_stream(broker, topic, wanted.partition, NO_LEADER_EPOCH)
    if stream is None:
        return refused(error)
    if not broker.ownership.may_acknowledge():
        # A broker of a cluster whose lease is not confirmed may have lost the partition: another leader
        # may have aborted transactions in it since (the client asks again, after new metadata).
        return refused(ErrorCode.not_leader_or_follower)
    txns = broker.partition_txns
    stable = txns.last_stable_offset(stream.stream_id, stream.end_offset)
    ranges, more = budget.take(txns.aborted_ranges(stream.stream_id, wanted.from_offset, wanted.to_offset))
    return PartitionRanges(wanted.partition, int(ErrorCode.none), stable, more, ranges)


async def aborted_ranges_request(broker: Broker, request: Request, session: Session) -> Prebuilt:
    """Each partition's ranges, or its error; Read on each topic (the decoder bounded the partitions)."""
    body = request.body
    assert isinstance(body, AbortedRangesRequest)
    invariant(body.partitions <= PARTITIONS_MAX, f"the decoder let {body.partitions} partitions through")
    budget = _Budget()
    topics = []
    for topic, partitions in body.topics:
        if not session.may_topic(Operation.READ, topic):
            denied = int(ErrorCode.topic_authorization_failed)
            topics.append((topic, tuple(PartitionRanges(p.partition, denied, -1, False, ()) for p in partitions)))
            continue
        topics.append((topic, tuple(_partition(broker, topic, p, budget) for p in partitions)))
    return _answer(request, AbortedRangesResponse(topics=tuple(topics), throttle_time_ms=request.throttle_ms))


APIS = [Api(API_KEY, API_NAME, 0, 0, aborted_ranges_request)]
