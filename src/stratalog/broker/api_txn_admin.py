"""What Kafka's admin tools show of transactions (KIP-664): DescribeTransactions, ListTransactions and
DescribeProducers, from the coordinator's state (broker/transactions.py) and the idempotent producers'
(broker/producers.py). kafka-transactions.sh, confluent-kafka's and the Java AdminClient's
describe_transactions / list_transactions / describe_producers ask them to find a hanging transaction.
"""

from __future__ import annotations

import datetime
import time
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from stratalog.broker.acls import Operation, ResourceType
from stratalog.broker.apis import Api
from stratalog.broker.session import Session
from stratalog.broker.txn_state import OPEN_STATES, Txn, TxnState
from stratalog.cluster.assignment import Kind
from stratalog.kafka.api_keys import ApiKey
from stratalog.kafka.codec import Request

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker

#: What Kafka sends for a time it has not got (a transaction not begun, a producer's last write).
NO_TIME_MS = -1
#: The start time beside an error (an unknown transactional id): Kafka's -1, which some clients' readers
#: refuse to parse as a time (kio's); no client reads it beside an error.
ERROR_TIME_MS = 0


def _when(ms: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ms / 1000, tz=datetime.UTC)


def _described(txn: Txn) -> dict[str, Any]:
    topics: dict[str, list[int]] = {}
    for p in txn.partitions if txn.state in OPEN_STATES else ():
        topics.setdefault(p.topic, []).append(p.partition)
    return {"error_code": ErrorCode.none, "transactional_id": txn.transactional_id,
            "transaction_state": txn.state.value, "transaction_timeout": txn.timeout_ms,
            "transaction_start_time": _when(txn.started_ms if txn.started_ms else NO_TIME_MS),
            "producer_id": txn.producer_id, "producer_epoch": txn.producer_epoch,
            "topics": [{"topic": t, "partitions": ps} for t, ps in topics.items()]}


async def describe_transactions(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    states = []
    for txn_id in request.body.transactional_ids:
        txn = broker.transactions.get(txn_id)
        error = ErrorCode.none
        if not session.may(Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, txn_id):
            error = ErrorCode.transactional_id_authorization_failed
        elif not broker.ownership.coordinates(txn_id, Kind.TRANSACTION):
            error = ErrorCode.not_coordinator   # a cluster: the admin client asks the id's coordinator
        elif txn is None:
            error = ErrorCode.transactional_id_not_found
        states.append(_described(txn) if txn is not None and not error else {
            "error_code": error, "transactional_id": txn_id, "transaction_state": "",
            "transaction_timeout": 0, "transaction_start_time": _when(ERROR_TIME_MS), "producer_id": -1,
            "producer_epoch": -1, "topics": []})
    return {"throttle_time": 0, "transaction_states": states}


async def list_transactions(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    body = request.body
    known = {s.value for s in TxnState}
    states = set(body.state_filters) & known
    producers = set(body.producer_id_filters)
    longer_than_ms = getattr(body, "duration_filter", -1)
    now_ms = int(time.time() * 1000)
    found = []
    for txn in broker.transactions.all():
        if (states and txn.state.value not in states) or (producers and txn.producer_id not in producers):
            continue
        if longer_than_ms >= 0 and not (txn.started_ms and now_ms - txn.started_ms > longer_than_ms):
            continue
        if session.may(Operation.DESCRIBE, ResourceType.TRANSACTIONAL_ID, txn.transactional_id):
            found.append({"transactional_id": txn.transactional_id, "producer_id": txn.producer_id,
                          "transaction_state": txn.state.value})
    return {"throttle_time": 0, "error_code": ErrorCode.none,
            "unknown_state_filters": sorted(set(body.state_filters) - known), "transaction_states": found}


async def describe_producers(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    topics = []
    active = broker.producers.entries()
    for t in request.body.topics:
        partitions = []
        allowed = session.may_topic(Operation.READ, t.name)
        for index in t.partition_indexes:
            stream = broker.partition(t.name, index) if allowed else None
            entry: dict[str, Any] = {"partition_index": index, "error_code": ErrorCode.none, "error_message": None,
                                     "active_producers": []}
            partitions.append(entry)
            if not allowed:
                entry["error_code"] = ErrorCode.topic_authorization_failed
                continue
            if stream is None:
                entry["error_code"] = broker.partition_error(t.name, index)
                continue
            entry["active_producers"] = [
                {"producer_id": pid, "producer_epoch": epoch, "last_sequence": batches[-1][1] if batches else -1,
                 "last_timestamp": NO_TIME_MS, "coordinator_epoch": -1,
                 "current_txn_start_offset": broker.partition_txns.open_first_offset(stream.stream_id, pid)}
                for pid, stream_id, epoch, batches in active if stream_id == stream.stream_id]
        topics.append({"name": t.name, "partitions": partitions})
    return {"throttle_time": 0, "topics": topics}


APIS = (
    Api(ApiKey.DESCRIBE_PRODUCERS, "DescribeProducers", 0, 0, describe_producers),
    Api(ApiKey.DESCRIBE_TRANSACTIONS, "DescribeTransactions", 0, 0, describe_transactions),
    Api(ApiKey.LIST_TRANSACTIONS, "ListTransactions", 0, 1, list_transactions),
)
