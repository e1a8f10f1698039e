"""StratalogCommitStaged: a Spark write's staged objects become the next records of topic partitions.

A Spark job writing to a running broker stages objects in the broker's object storage (its tasks put
them under ``spark-staging/``); its driver then sends this request, and the broker commits them
(engine/staging.py): the broker stays the only writer of its metadata. Records land at each partition's
end after whatever producers appended before; producers to those partitions wait only for the metadata
commit. A streaming write names its sink and micro-batch: a batch committed before is answered
``committed = false`` and writes nothing, so a replayed micro-batch is exactly once.

A broker alone commits the whole request in one metadata transaction. A broker of a cluster leads some
partitions only, so it commits each partition it leads on its own (one transaction each; a micro-batch
under a marker per sink and partition (engine/sink_markers.py), as another
broker commits the batch's other partitions) and answers NOT_LEADER_OR_FOLLOWER for the others, their
staged objects untouched: the driver sends those to their leaders (spark/broker_write.py). A retried
request commits only what no earlier attempt committed.

Each topic written needs Write (and Create, when it does not exist and auto-creation is on), as a
produce would. Object keys must lie under ``spark-staging/``: a client cannot make the broker move any
other object.

StratalogReplaceObjects: a compaction run by Spark beside the broker (``stratalog pipeline compact
kafka://...``) stages per-stream objects and asks the broker to swap them for the objects they merge. The
broker swaps them only if they hold exactly the ranges the old objects still hold (engine/staging.py), so a
trim or upload meanwhile makes the request fail, never lose data. In a cluster the swap is fenced as any
metadata change: a broker swaps only objects whose partitions it leads, and answers NOT_LEADER_OR_FOLLOWER
otherwise (the driver sends each broker the objects of its own partitions). Rewriting stored objects is an
administrator's act: it needs Alter on the cluster.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from kio.schema.errors import ErrorCode

from stratalog.broker.acls import Operation
from stratalog.broker.apis import Api
from stratalog.broker.session import Session
from stratalog.broker.topics import parse_stream_name
from stratalog.cluster.leases import ClusterError
from stratalog.engine import BackpressureError, StoreClosedError, StoreFailedError
from stratalog.engine.objformat import CorruptObjectError
from stratalog.engine.sink_markers import partition_marker_key, sink_marker_key
from stratalog.engine.staging import (
    STAGED_OBJECTS_MAX,
    STAGING_PREFIX,
    CommitResult,
    StagedObject,
    StagedStream,
    StagedWrite,
    commit_staged,
    replace_with_staged,
)
from stratalog.engine.store import DATA_PREFIX
from stratalog.kafka.codec import Prebuilt, Request
from stratalog.kafka.staged_commit import (
    API_KEY,
    API_NAME,
    COMMIT_VERSION_MAX,
    REPLACE_API_KEY,
    REPLACE_API_NAME,
    CommitStagedRequest,
    CommitStagedResponse,
    PartitionResult,
    ReplaceObjectsRequest,
    encode_response,
)
from stratalog.objects.local import check_key
from stratalog.objects.store import ObjectNotFoundError, ObjectStoreError

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker

log = logging.getLogger("stratalog.broker")

class _RefusedError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def _writes(body: CommitStagedRequest) -> list[StagedWrite]:
    """The request as staged writes, each value checked; _RefusedError (INVALID_REQUEST) naming the first bad one."""
    if (body.sink_id is None) != (body.batch_id == -1):
        raise _RefusedError(ErrorCode.invalid_request, "a streaming write gives a sink id and a batch id >= 0; a batch "
                                                  "write neither (batch id -1)")
    if body.sink_id is not None and (not body.sink_id or body.batch_id < 0):
        raise _RefusedError(ErrorCode.invalid_request, "the sink id must not be empty and the batch id must be >= 0")
    if len(body.objects) > STAGED_OBJECTS_MAX:
        raise _RefusedError(ErrorCode.invalid_request, f"{len(body.objects)} staged objects in one request; at most "
                                                       f"{STAGED_OBJECTS_MAX}")
    by_task: dict[int, list[StagedObject]] = {}
    for o in body.objects:
        refused = _staged_key_refusal(o.key, o.size_bytes)
        if refused is not None or not o.streams:
            raise _RefusedError(ErrorCode.invalid_request, refused or f"object {o.key[:100]!r} holds no stream")
        for s in o.streams:
            if parse_stream_name(s.name) is None or s.start < 0 or s.count <= 0:
                raise _RefusedError(ErrorCode.invalid_request,
                                    f"object {o.key[:100]!r}: stream {s.name[:100]!r} must be named "
                                    "topic/partition and hold records from offset >= 0")
        streams = tuple(StagedStream(s.name, s.start, s.count) for s in o.streams)
        by_task.setdefault(o.partition, []).append(StagedObject(o.key, o.size_bytes, streams))
    return [StagedWrite(task, tuple(objects)) for task, objects in sorted(by_task.items())]


def _check_partitions(broker: Broker, session: Session, writes: list[StagedWrite]) -> list[int]:
    """The stream ids written, after authorization and existence checks (topics created as a produce would);
    _RefusedError for the first partition refused."""
    stream_ids = []
    for name in sorted({s.name for w in writes for o in w.objects for s in o.streams}):
        stream_id, refusal = _partition_check(broker, session, name)
        if refusal is not None:
            raise refusal
        stream_ids.append(stream_id)
    return stream_ids


def _partition_check(broker: Broker, session: Session, name: str) -> tuple[int, _RefusedError | None]:
    """The stream id of partition ``name`` (``topic/partition``) if this broker may commit to it here, else
    why not: not authorized, no such partition, or (in a cluster) led by another broker."""
    topic_name, partition = parse_stream_name(name) or ("", 0)
    if not session.may_topic(Operation.WRITE, topic_name):
        return -1, _RefusedError(ErrorCode.topic_authorization_failed,
                                 f"not authorized to write to topic {topic_name!r}")
    if broker.topics.get(topic_name) is None and session.may_create_topic(topic_name):
        broker.auto_create(topic_name)
    stream = broker.partition(topic_name, partition) if broker.topics.get(topic_name) is not None else None
    if stream is None:
        code = ErrorCode(broker.partition_error(topic_name, partition))
        if code == ErrorCode.not_leader_or_follower:
            return -1, _RefusedError(code, f"partition {partition} of topic {topic_name!r} is led by another broker")
        return -1, _RefusedError(code, f"no partition {partition} of topic {topic_name!r}")
    return stream.stream_id, None


def _answer(request: Request, code: ErrorCode = ErrorCode.none, message: str | None = None,
            result: CommitResult | None = None, partitions: tuple[PartitionResult, ...] = ()) -> Prebuilt:
    """The response frame, at the request's version: an error, or what was committed."""
    done = result or CommitResult(False, 0, 0)
    response = CommitStagedResponse(int(code), message, done.committed, done.records, done.objects,
                                    throttle_time_ms=request.throttle_ms, partitions=partitions)
    version = request.api_version if request.api_key == API_KEY else 0
    return Prebuilt([encode_response(request.correlation_id, response, version)], request.throttle_ms)


async def commit_staged_request(broker: Broker, request: Request, session: Session) -> Prebuilt:
    body = request.body
    assert isinstance(body, CommitStagedRequest)

    try:
        writes = _writes(body)
        if broker.ownership.in_cluster:
            return await _commit_by_partition(broker, request, session, body, writes)
        stream_ids = _check_partitions(broker, session, writes)
    except _RefusedError as e:
        return _answer(request, e.code, str(e))
    marker = (sink_marker_key(body.sink_id), body.batch_id) if body.sink_id is not None else None
    code, message, result = await _commit(broker, session, writes, marker, stream_ids)
    names = sorted({s.name for w in writes for o in w.objects for s in o.streams})
    # Alone, the broker commits the whole write in one transaction: every partition shares its outcome.
    partitions = tuple(PartitionResult(name, int(code), message, result.committed,
                                       _records(writes, name) if result.committed else 0) for name in names)
    return _answer(request, code, message, result, partitions)


async def _commit(broker: Broker, session: Session, writes: list[StagedWrite], marker: tuple[str, int] | None,
                  stream_ids: list[int]) -> tuple[ErrorCode, str | None, CommitResult]:
    """One commit_staged in a worker thread: (error code, message, result). A refusal of the cluster's fence
    (the partition moved to another broker, or this broker's lease ran out, since it was checked) is
    NOT_LEADER_OR_FOLLOWER."""
    nothing = CommitResult(False, 0, 0)
    try:
        # A fence refusal (the partition moved since it was checked) keeps the staged objects: the writer
        # sends the partition again to its new leader.
        result = await asyncio.to_thread(commit_staged, broker.store, writes, marker, create_streams=False,
                                         keep_staged_on=(ClusterError,))
    except (CorruptObjectError, ObjectNotFoundError) as e:
        return ErrorCode.invalid_request, f"a staged object is not as reported: {e}", nothing
    except BackpressureError as e:
        return ErrorCode.request_timed_out, str(e), nothing
    except ClusterError as e:
        return ErrorCode.not_leader_or_follower, f"not committed: {e}", nothing
    except (StoreFailedError, StoreClosedError, ObjectStoreError) as e:
        log.error("%s from %s failed: %s", API_NAME, session.host, e)
        return ErrorCode.kafka_storage_error, str(e), nothing
    if result.committed:
        for stream_id in stream_ids:
            broker.data_arrived(stream_id)
    return ErrorCode.none, None, result


def _records(writes: list[StagedWrite], name: str) -> int:
    return sum(s.count for w in writes for o in w.objects for s in o.streams if s.name == name)


def _by_partition(writes: list[StagedWrite]) -> dict[str, list[StagedWrite]]:
    """The request's staged objects by the partition each holds; _RefusedError for one holding several."""
    by_name: dict[str, list[StagedWrite]] = {}
    for w in writes:
        for o in w.objects:
            if len(o.streams) != 1:
                raise _RefusedError(ErrorCode.invalid_request,
                                    f"object {o.key[:100]!r} holds {len(o.streams)} partitions: a broker of a "
                                    "cluster commits staged objects of one partition each")
            by_name.setdefault(o.streams[0].name, []).append(StagedWrite(w.partition, (o,)))
    return by_name


async def _commit_by_partition(broker: Broker, request: Request, session: Session, body: CommitStagedRequest,
                               writes: list[StagedWrite]) -> Prebuilt:
    """A broker of a cluster commits each partition of the request on its own: each one it leads in one
    metadata transaction (a micro-batch under the partition's own marker, since another broker may have
    committed the batch's other partitions), and refuses the others (NOT_LEADER_OR_FOLLOWER) without
    touching their staged objects, for the driver to send them to their leaders."""
    results = []
    total = CommitResult(False, 0, 0)
    for name, group in sorted(_by_partition(writes).items()):
        stream_id, refusal = _partition_check(broker, session, name)
        if refusal is not None:
            results.append(PartitionResult(name, int(refusal.code), str(refusal)))
            continue
        marker = None
        if body.sink_id is not None:
            # A batch committed whole, before writes were split by partition, stands for every partition.
            whole = await asyncio.to_thread(broker.store.metadata.get_meta, sink_marker_key(body.sink_id), -1)
            if whole >= body.batch_id:
                results.append(PartitionResult(name))
                continue
            marker = (partition_marker_key(body.sink_id, name), body.batch_id)
        code, message, result = await _commit(broker, session, group, marker, [stream_id])
        results.append(PartitionResult(name, int(code), message, result.committed, result.records))
        total = CommitResult(total.committed or result.committed, total.records + result.records,
                             total.objects + result.objects)
    if request.api_version == 0:
        refused = next((r for r in results if r.error_code), None)
        if refused is not None:
            return _answer(request, ErrorCode(refused.error_code), f"{refused.name}: {refused.error_message}", total)
    return _answer(request, result=total, partitions=tuple(results))


def _replace_refusal(body: ReplaceObjectsRequest, session: Session) -> tuple[ErrorCode, str] | None:
    if not session.may_cluster(Operation.ALTER):
        return ErrorCode.cluster_authorization_failed, "replacing objects needs Alter on the cluster"
    if len(body.staged) > STAGED_OBJECTS_MAX:
        return ErrorCode.invalid_request, f"{len(body.staged)} staged objects in one request; at most " \
                                          f"{STAGED_OBJECTS_MAX}"
    for key in body.replaced:
        if not key.startswith(DATA_PREFIX):
            return ErrorCode.invalid_request, f"{key[:100]!r} is not a data object"
    for key, size in body.staged:
        refused = _staged_key_refusal(key, size)
        if refused is not None:
            return ErrorCode.invalid_request, refused
    return None


def _staged_key_refusal(key: str, size_bytes: int) -> str | None:
    """Why a request may not name this staged object, or None: it must be a valid key under
    ``spark-staging/`` (a client cannot make the broker move any other object) and hold bytes."""
    try:
        check_key(key)
    except ValueError as e:
        return f"object key {key[:100]!r}: {e}"
    if not key.startswith(STAGING_PREFIX) or size_bytes <= 0:
        return f"object {key[:100]!r}: staged objects lie under {STAGING_PREFIX} and hold bytes"
    return None


async def replace_objects_request(broker: Broker, request: Request, session: Session) -> Prebuilt:
    body = request.body
    assert isinstance(body, ReplaceObjectsRequest)

    refused = _replace_refusal(body, session)
    if refused is not None:
        return _answer(request, *refused)
    try:
        result = await asyncio.to_thread(replace_with_staged, broker.store, body.replaced, body.staged)
    except (ValueError, CorruptObjectError, ObjectNotFoundError) as e:
        return _answer(request, ErrorCode.invalid_request, f"not replaced: {e}")
    except ClusterError as e:   # the fence: an object holds a partition this broker does not lead
        return _answer(request, ErrorCode.not_leader_or_follower, f"not replaced: {e}")
    except (StoreFailedError, StoreClosedError, ObjectStoreError) as e:
        log.error("%s from %s failed: %s", REPLACE_API_NAME, session.host, e)
        return _answer(request, ErrorCode.kafka_storage_error, str(e))
    log.info("replaced %d objects with %d staged by %s", len(body.replaced), result.objects, session.principal)
    return _answer(request, result=result)


APIS = [Api(API_KEY, API_NAME, 0, COMMIT_VERSION_MAX, commit_staged_request, ordered=True),
        Api(REPLACE_API_KEY, REPLACE_API_NAME, 0, 0, replace_objects_request,
            ordered=True)]
