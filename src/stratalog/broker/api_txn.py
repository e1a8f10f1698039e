"""The transaction APIs (KIP-98, KIP-447): AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit and EndTxn,
at the versions Kafka clients send (0-3: from 4 on they are the brokers' own, KIP-890). InitProducerId and
FindCoordinator, which transactions share with idempotence and groups, are in api_log.py and
api_cluster.py. The rules and the state are broker/transactions.py's; these are the wire's shell:
authorization, the request's fields in, the version's answer out.

In a cluster, a transactional id's coordinator is whichever broker holds it (FindCoordinator names it);
the others answer NOT_COORDINATOR, and the client finds it again. TxnOffsetCommit goes to the group's
coordinator, which may not be the transaction's: it then keeps the offsets with the transaction in the
database (broker/txn_table.py).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from stratalog.broker.acls import Operation, ResourceType
from stratalog.broker.apis import Api
from stratalog.broker.session import Session
from stratalog.broker.txn_state import PendingOffset
from stratalog.kafka.api_keys import ApiKey
from stratalog.kafka.codec import Request

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker

log = logging.getLogger("stratalog.broker.transactions")

#: Below these versions a fenced producer is told INVALID_PRODUCER_EPOCH: PRODUCER_FENCED (KIP-588) came
#: with them, and older clients know only the former.
PRODUCER_FENCED_FROM_VERSION = {ApiKey.ADD_PARTITIONS_TO_TXN: 2, ApiKey.ADD_OFFSETS_TO_TXN: 2,
                                ApiKey.END_TXN: 2, ApiKey.TXN_OFFSET_COMMIT: 3, ApiKey.INIT_PRODUCER_ID: 4}


def refusal(broker: Broker, session: Session, txn_id: str, what: str,
            operation: Operation = Operation.WRITE) -> ErrorCode | None:
    """The answer for a transactional request this broker does not take (None: it takes it). Kafka's ACLs:
    WRITE on the transactional id for what changes a transaction, DESCRIBE to find its coordinator."""
    if not session.may(operation, ResourceType.TRANSACTIONAL_ID, txn_id):
        log.info("%s refused: %s may not %s transactional id %r", what, session.principal, operation.name, txn_id)
        return ErrorCode.transactional_id_authorization_failed
    return None


def partition_exists(broker: Broker, topic: str, index: int) -> bool:
    """Whether the partition exists, led here or (in a cluster) by another broker."""
    known = broker.topics.get(topic)
    return known is not None and 0 <= index < known.partitions


def versioned(error: ErrorCode, request: Request) -> ErrorCode:
    """``error`` as the request's version knows it."""
    if error == ErrorCode.producer_fenced and request.api_version < PRODUCER_FENCED_FROM_VERSION.get(
            ApiKey(request.api_key), 0):
        return ErrorCode.invalid_producer_epoch
    return error


async def add_partitions_to_txn(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    body = request.body
    txn_id = body.v3_and_below_transactional_id
    wanted = [(t.name, int(p)) for t in body.v3_and_below_topics for p in t.partitions]
    errors = {key: ErrorCode.none for key in wanted}
    refused = refusal(broker, session, txn_id, "AddPartitionsToTxn")
    if refused is not None:
        errors = dict.fromkeys(wanted, refused)
    elif len(wanted) > broker.config.transaction_partitions_max:
        errors = dict.fromkeys(wanted, ErrorCode.invalid_request)
    else:
        for topic, index in wanted:
            if not session.may_topic(Operation.WRITE, topic):
                errors[(topic, index)] = ErrorCode.topic_authorization_failed
            elif not partition_exists(broker, topic, index):
                errors[(topic, index)] = ErrorCode.unknown_topic_or_partition
        if any(errors.values()):
            # As Kafka: nothing is added when a partition is refused; the others are not attempted.
            errors = {key: e or ErrorCode.operation_not_attempted for key, e in errors.items()}
        else:
            error = await broker.transactions.add_partitions(txn_id, body.v3_and_below_producer_id,
                                                             body.v3_and_below_producer_epoch, wanted)
            errors = dict.fromkeys(wanted, versioned(error, request))
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, index), error in errors.items():
        by_topic.setdefault(topic, []).append({"partition_index": index, "partition_error_code": error})
    return {"throttle_time": 0, "results_by_topic_v3_and_below": [
        {"name": topic, "results_by_partition": results} for topic, results in by_topic.items()]}


async def add_offsets_to_txn(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    body = request.body
    error = refusal(broker, session, body.transactional_id, "AddOffsetsToTxn")
    if error is None and not session.may_group(Operation.READ, body.group_id):
        error = ErrorCode.group_authorization_failed
    if error is None:
        error = versioned(await broker.transactions.add_offsets(body.transactional_id, body.producer_id,
                                                                body.producer_epoch, body.group_id), request)
    return {"throttle_time": 0, "error_code": error}


async def txn_offset_commit(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    body = request.body
    error = refusal(broker, session, body.transactional_id, "TxnOffsetCommit")
    if error is None and not session.may_group(Operation.READ, body.group_id):
        error = ErrorCode.group_authorization_failed
    if error is None and not broker.ownership.coordinates(body.group_id):
        error = ErrorCode.not_coordinator   # sent to the group's coordinator, as OffsetCommit
    offsets: list[PendingOffset] = []
    codes: dict[tuple[str, int], ErrorCode] = {}
    for t in body.topics:
        known = broker.topics.get(t.name)
        for p in t.partitions:
            code = error or ErrorCode.none
            if not code and not session.may_topic(Operation.READ, t.name):
                code = ErrorCode.topic_authorization_failed
            if not code and (known is None or not 0 <= p.partition_index < known.partitions):
                code = ErrorCode.unknown_topic_or_partition
            if not code:
                code = ErrorCode(broker.offsets.metadata_error(p.committed_metadata))
            if not code:
                offsets.append(PendingOffset(body.group_id, t.name, p.partition_index, p.committed_offset,
                                             getattr(p, "committed_leader_epoch", -1), p.committed_metadata))
            codes[(t.name, p.partition_index)] = code
    if offsets:
        outcome = versioned(await broker.transactions.offset_commit(
            body.transactional_id, body.producer_id, body.producer_epoch, body.group_id, tuple(offsets)), request)
        codes = {key: code or outcome for key, code in codes.items()}
    by_topic: dict[str, list[dict[str, Any]]] = {}
    for (topic, index), code in codes.items():
        by_topic.setdefault(topic, []).append({"partition_index": index, "error_code": code})
    return {"throttle_time": 0, "topics": [{"name": topic, "partitions": parts} for topic, parts in by_topic.items()]}


async def end_txn(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    body = request.body
    error = refusal(broker, session, body.transactional_id, "EndTxn")
    if error is None:
        error = versioned(await broker.transactions.end_txn(body.transactional_id, body.producer_id,
                                                            body.producer_epoch, body.committed), request)
    return {"throttle_time": 0, "error_code": error}


APIS = (
    Api(ApiKey.ADD_PARTITIONS_TO_TXN, "AddPartitionsToTxn", 0, 3, add_partitions_to_txn, ordered=True),
    Api(ApiKey.ADD_OFFSETS_TO_TXN, "AddOffsetsToTxn", 0, 3, add_offsets_to_txn, ordered=True),
    Api(ApiKey.END_TXN, "EndTxn", 0, 3, end_txn, ordered=True),
    Api(ApiKey.TXN_OFFSET_COMMIT, "TxnOffsetCommit", 0, 3, txn_offset_commit, ordered=True),
)
