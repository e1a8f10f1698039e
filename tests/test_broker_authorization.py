"""Every API checks the principal's ACLs before it touches data, and answers Kafka's error when refused.

The handlers are called in-process with a session per principal (no socket: the wire is covered in
test_broker_security.py): ``bob`` has no ACLs, ``alice`` the ones each request needs. One row per API;
a test fails if an API is served that this table does not cover.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader

from stratalog.broker.acls import Acl, AuthorizerConfig, Operation, PatternType, Permission, ResourceType
from stratalog.broker.broker import Broker
from stratalog.broker.config import BrokerConfig
from stratalog.broker.listeners import Listener
from stratalog.broker.session import Session
from stratalog.engine.staging import STAGED_OBJECTS_MAX, STAGING_PREFIX
from stratalog.kafka import aborted_ranges
from stratalog.kafka.build import build
from stratalog.kafka.codec import Prebuilt, Request, decode_request, encode_request
from stratalog.kafka.records import encode_batch
from stratalog.kafka.staged_commit import API_KEY as STAGED_API_KEY
from stratalog.kafka.staged_commit import (
    REPLACE_API_KEY,
    CommitStagedRequest,
    CommitStagedResponse,
    ReplaceObjectsRequest,
    StagedObjectEntry,
    StagedStreamEntry,
    decode_response,
)
from stratalog.records import NewRecord
from stratalog.spark.write import StagingWriter

TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
TXN = ResourceType.TRANSACTIONAL_ID
TOPIC_DENIED, GROUP_DENIED, CLUSTER_DENIED = (ErrorCode.topic_authorization_failed,
                                              ErrorCode.group_authorization_failed,
                                              ErrorCode.cluster_authorization_failed)
TXN_DENIED = ErrorCode.transactional_id_authorization_failed
#: The APIs that every client may call: before a login, and to log in.
OPEN_APIS = {18, 17, 36}
_ids = itertools.count(1)


#: The broker's own APIs with a row in ROWS: the request of a row's body (its dataclass's fields), and the
#: response's decoder (kio knows neither).
OWN_ROWS: dict[int, tuple[Callable[[int, dict[str, Any]], bytes], Callable[[bytes], Any]]] = {
    aborted_ranges.API_KEY: (
        lambda cid, body: aborted_ranges.encode_request(cid, "test", aborted_ranges.AbortedRangesRequest(**body))[4:],
        lambda frame: aborted_ranges.decode_response(frame)[1]),
}


def call(broker: Broker, session: Session, key: int, version: int, body: dict[str, Any]) -> Any:
    """The handler's response as a kio object (Prebuilt frames decoded), or for the broker's own APIs
    their codec's response. The request goes through the codec's decoding, as the server's does."""
    own = OWN_ROWS.get(key)
    if own is not None:
        frame = own[0](next(_ids), body)
    else:
        frame = encode_request(key, version, next(_ids), "test", build(load_request_schema(key, version), body))
    request = decode_request(frame, {key: (version, version)})

    async def run() -> Any:
        return await broker.apis[key].handler(broker, request, session)

    values = asyncio.get_event_loop().run_until_complete(run())
    if own is not None:
        return own[1](b"".join(bytes(p) for p in values.pieces)[4:])
    schema = load_response_schema(key, version)
    if isinstance(values, Prebuilt):
        frame = b"".join(bytes(p) for p in values.pieces)[4:]
        _, used = entity_reader(schema.__header_schema__)(frame, 0)
        return entity_reader(schema)(frame, used)[0]
    return build(schema, values)


class World:
    """A broker with ACLs on, topic ``t`` (one record) and group ``g``, and the sessions of two principals."""

    def __init__(self, tmp_path: Path) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        config = BrokerConfig(authorizer=AuthorizerConfig(enabled=True, super_users=("User:admin",)))

        async def open_broker() -> Broker:
            return Broker.open(tmp_path / "data", config)

        self.broker = self.loop.run_until_complete(open_broker())
        listener = Listener.parse("SASL_PLAINTEXT://127.0.0.1:9092")
        self.session = {name: Session(listener, "127.0.0.1", self.broker.authorizer, principal=f"User:{name}")
                        for name in ("admin", "alice", "bob")}
        self.broker.create_topic("t", 1, {})
        produced = self.produce("admin", "t")
        assert produced == ErrorCode.none, produced

    def produce(self, who: str, topic: str) -> ErrorCode:
        batch = encode_batch([(None, b"v", (), 1_000)], base_offset=0)
        response = call(self.broker, self.session[who], 0, 9, {"acks": -1, "timeout": 5000, "topic_data": [
            {"name": topic, "partition_data": [{"index": 0, "records": batch}]}]})
        return ErrorCode(response.responses[0].partition_responses[0].error_code)

    def allow(self, resource_type: ResourceType, name: str, *ops: Operation,
              pattern: PatternType = PatternType.LITERAL) -> None:
        self.broker.authorizer.add([Acl(resource_type, name, pattern, "User:alice", "*", op, Permission.ALLOW)
                                    for op in ops])

    def close(self) -> None:
        self.loop.run_until_complete(self.broker.close())
        self.loop.close()
        asyncio.set_event_loop(None)


@pytest.fixture
def world(tmp_path: Path) -> Any:
    made = World(tmp_path)
    yield made
    made.close()


def end_offset(world: World) -> int:
    stream = world.broker.partition("t", 0)
    assert stream is not None
    return int(stream.end_offset)


# One row per API: (key, version, body, what bob gets, the ACLs alice is given, what alice gets).
Row = tuple[int, int, dict[str, Any], Callable[[Any], Any], list[tuple[ResourceType, str, Operation]], Any, Any]
FETCH = {"replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0, "session_id": 0,
         "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "", "topics": [
             {"topic": "t", "partitions": [{"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0,
                                            "last_fetched_epoch": -1, "log_start_offset": -1,
                                            "partition_max_bytes": 1 << 20}]}]}
ROWS: dict[str, Row] = {
    "Fetch": (1, 12, FETCH, lambda r: r.responses[0].partitions[0].error_code,
              [(TOPIC, "t", Operation.READ)], TOPIC_DENIED, ErrorCode.none),
    "ListOffsets": (2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": "t", "partitions": [{"partition_index": 0, "timestamp": -1}]}]},
        lambda r: r.topics[0].partitions[0].error_code, [(TOPIC, "t", Operation.DESCRIBE)], TOPIC_DENIED,
        ErrorCode.none),
    "StratalogAbortedRanges": (aborted_ranges.API_KEY, 0, {"topics": (
        ("t", (aborted_ranges.WantedPartition(0, 0, 1),)),)}, lambda r: r.topics[0][1][0].error_code,
        [(TOPIC, "t", Operation.READ)], TOPIC_DENIED, ErrorCode.none),
    "Metadata": (3, 12, {"topics": [{"name": "t", "topic_id": None}], "allow_auto_topic_creation": False,
                         "include_topic_authorized_operations": False},
                 lambda r: r.topics[0].error_code, [(TOPIC, "t", Operation.DESCRIBE)], TOPIC_DENIED, ErrorCode.none),
    "OffsetCommit": (8, 8, {"group_id": "g", "generation_id_or_member_epoch": -1, "member_id": "",
                            "group_instance_id": None, "topics": [
        {"name": "t", "partitions": [{"partition_index": 0, "committed_offset": 1, "committed_leader_epoch": -1,
                                      "committed_metadata": ""}]}]},
        lambda r: r.topics[0].partitions[0].error_code, [(GROUP, "g", Operation.READ), (TOPIC, "t", Operation.READ)],
        GROUP_DENIED, ErrorCode.none),
    "OffsetFetch": (9, 8, {"groups": [{"group_id": "g", "topics": None}], "require_stable": False},
                    lambda r: r.groups[0].error_code, [(GROUP, "g", Operation.DESCRIBE)], GROUP_DENIED, ErrorCode.none),
    "FindCoordinator": (10, 4, {"key_type": 0, "coordinator_keys": ["g"]}, lambda r: r.coordinators[0].error_code,
                        [(GROUP, "g", Operation.DESCRIBE)], GROUP_DENIED, ErrorCode.none),
    "JoinGroup": (11, 7, {"group_id": "g", "session_timeout": 10_000, "rebalance_timeout": 10_000,
                          "member_id": "", "group_instance_id": None, "protocol_type": "consumer",
                          "protocols": [{"name": "range", "metadata": b""}], "reason": None},
                  lambda r: r.error_code, [(GROUP, "g", Operation.READ)], GROUP_DENIED, ErrorCode.member_id_required),
    "Heartbeat": (12, 4, {"group_id": "g", "generation_id": 1, "member_id": "m", "group_instance_id": None},
                  lambda r: r.error_code, [(GROUP, "g", Operation.READ)], GROUP_DENIED, ErrorCode.unknown_member_id),
    "LeaveGroup": (13, 5, {"group_id": "g", "members": [{"member_id": "m", "group_instance_id": None,
                                                        "reason": None}]},
                   lambda r: r.error_code, [(GROUP, "g", Operation.READ)], GROUP_DENIED, None),
    "SyncGroup": (14, 5, {"group_id": "g", "generation_id": 1, "member_id": "m", "group_instance_id": None,
                          "protocol_type": "consumer", "protocol_name": "range", "assignments": []},
                  lambda r: r.error_code, [(GROUP, "g", Operation.READ)], GROUP_DENIED, ErrorCode.unknown_member_id),
    "DescribeGroups": (15, 5, {"groups": ["g"], "include_authorized_operations": False},
                       lambda r: r.groups[0].error_code, [(GROUP, "g", Operation.DESCRIBE)], GROUP_DENIED,
                       ErrorCode.none),
    "CreateTopics": (19, 7, {"topics": [{"name": "new", "num_partitions": 1, "replication_factor": 1,
                                         "assignments": [], "configs": []}], "timeout": 5000, "validate_only": False},
                     lambda r: r.topics[0].error_code, [(TOPIC, "new", Operation.CREATE)], TOPIC_DENIED,
                     ErrorCode.none),
    "DeleteTopics": (20, 6, {"topics": [{"name": "t", "topic_id": None}], "timeout": 5000},
                     lambda r: r.responses[0].error_code, [(TOPIC, "t", Operation.DELETE)], TOPIC_DENIED,
                     ErrorCode.none),
    "DeleteRecords": (21, 2, {"topics": [{"name": "t", "partitions": [{"partition_index": 0, "offset": 1}]}],
                              "timeout": 5000},
                      lambda r: r.topics[0].partitions[0].error_code, [(TOPIC, "t", Operation.DELETE)],
                      TOPIC_DENIED, ErrorCode.none),
    "OffsetForLeaderEpoch": (23, 4, {"replica_id": -1, "topics": [
        {"topic": "t", "partitions": [{"partition": 0, "current_leader_epoch": 0, "leader_epoch": 0}]}]},
        lambda r: r.topics[0].partitions[0].error_code, [(TOPIC, "t", Operation.DESCRIBE)], TOPIC_DENIED,
        ErrorCode.none),
    "InitProducerId": (22, 4, {"transactional_id": None, "transaction_timeout": -1, "producer_id": -1,
                               "producer_epoch": -1},
                       lambda r: r.error_code, [(CLUSTER, "kafka-cluster", Operation.IDEMPOTENT_WRITE)],
                       CLUSTER_DENIED, ErrorCode.none),
    "AddPartitionsToTxn": (24, 3, {"v3_and_below_transactional_id": "tx", "v3_and_below_producer_id": 5,
                                   "v3_and_below_producer_epoch": 0,
                                   "v3_and_below_topics": [{"name": "t", "partitions": [0]}]},
                           lambda r: r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code,
                           [(TXN, "tx", Operation.WRITE), (TOPIC, "t", Operation.WRITE)], TXN_DENIED,
                           ErrorCode.invalid_producer_id_mapping),
    "AddOffsetsToTxn": (25, 3, {"transactional_id": "tx", "producer_id": 5, "producer_epoch": 0, "group_id": "g"},
                        lambda r: r.error_code, [(TXN, "tx", Operation.WRITE), (GROUP, "g", Operation.READ)],
                        TXN_DENIED, ErrorCode.invalid_producer_id_mapping),
    "EndTxn": (26, 3, {"transactional_id": "tx", "producer_id": 5, "producer_epoch": 0, "committed": True},
               lambda r: r.error_code, [(TXN, "tx", Operation.WRITE)], TXN_DENIED,
               ErrorCode.invalid_producer_id_mapping),
    "TxnOffsetCommit": (28, 3, {"transactional_id": "tx", "group_id": "g", "producer_id": 5, "producer_epoch": 0,
                                "generation_id": -1, "member_id": "", "group_instance_id": None, "topics": [
        {"name": "t", "partitions": [{"partition_index": 0, "committed_offset": 1, "committed_leader_epoch": -1,
                                      "committed_metadata": ""}]}]},
        lambda r: r.topics[0].partitions[0].error_code,
        [(TXN, "tx", Operation.WRITE), (GROUP, "g", Operation.READ), (TOPIC, "t", Operation.READ)], TXN_DENIED,
        ErrorCode.invalid_producer_id_mapping),
    "DescribeProducers": (61, 0, {"topics": [{"name": "t", "partition_indexes": [0]}]},
                          lambda r: r.topics[0].partitions[0].error_code, [(TOPIC, "t", Operation.READ)],
                          TOPIC_DENIED, ErrorCode.none),
    "DescribeTransactions": (65, 0, {"transactional_ids": ["tx"]}, lambda r: r.transaction_states[0].error_code,
                             [(TXN, "tx", Operation.DESCRIBE)], TXN_DENIED, ErrorCode.transactional_id_not_found),
    "DescribeAcls": (29, 3, {"resource_type_filter": 1, "resource_name_filter": None, "pattern_type_filter": 1,
                             "principal_filter": None, "host_filter": None, "operation": 1, "permission_type": 1},
                     lambda r: r.error_code, [(CLUSTER, "kafka-cluster", Operation.DESCRIBE)], CLUSTER_DENIED,
                     ErrorCode.none),
    "CreateAcls": (30, 3, {"creations": [{"resource_type": 2, "resource_name": "x", "resource_pattern_type": 3,
                                          "principal": "User:carol", "host": "*", "operation": 3,
                                          "permission_type": 3}]},
                   lambda r: r.results[0].error_code, [(CLUSTER, "kafka-cluster", Operation.ALTER)], CLUSTER_DENIED,
                   ErrorCode.none),
    "DeleteAcls": (31, 3, {"filters": [{"resource_type_filter": 2, "resource_name_filter": "x",
                                        "pattern_type_filter": 3, "principal_filter": None, "host_filter": None,
                                        "operation": 1, "permission_type": 1}]},
                   lambda r: r.filter_results[0].error_code, [(CLUSTER, "kafka-cluster", Operation.ALTER)],
                   CLUSTER_DENIED, ErrorCode.none),
    "DescribeConfigs": (32, 4, {"resources": [{"resource_type": 2, "resource_name": "t",
                                               "configuration_keys": None}],
                                "include_synonyms": False, "include_documentation": False},
                        lambda r: r.results[0].error_code, [(TOPIC, "t", Operation.DESCRIBE_CONFIGS)], TOPIC_DENIED,
                        ErrorCode.none),
    "AlterConfigs": (33, 2, {"resources": [{"resource_type": 2, "resource_name": "t", "configs": [
        {"name": "retention.ms", "value": "60000"}]}], "validate_only": True},
        lambda r: r.responses[0].error_code, [(TOPIC, "t", Operation.ALTER_CONFIGS)], TOPIC_DENIED, ErrorCode.none),
    "CreatePartitions": (37, 3, {"topics": [{"name": "t", "count": 2, "assignments": None}], "timeout": 5000,
                                 "validate_only": True},
                         lambda r: r.results[0].error_code, [(TOPIC, "t", Operation.ALTER)], TOPIC_DENIED,
                         ErrorCode.none),
    "DeleteGroups": (42, 2, {"groups_names": ["g"]}, lambda r: r.results[0].error_code,
                     [(GROUP, "g", Operation.DELETE)], GROUP_DENIED, ErrorCode.group_id_not_found),
    "IncrementalAlterConfigs": (44, 1, {"resources": [{"resource_type": 2, "resource_name": "t", "configs": [
        {"name": "retention.ms", "config_operation": 0, "value": "60000"}]}], "validate_only": True},
        lambda r: r.responses[0].error_code, [(TOPIC, "t", Operation.ALTER_CONFIGS)], TOPIC_DENIED, ErrorCode.none),
    "DescribeClientQuotas": (48, 1, {"components": [], "strict": False}, lambda r: r.error_code,
                             [(CLUSTER, "kafka-cluster", Operation.DESCRIBE_CONFIGS)], CLUSTER_DENIED, ErrorCode.none),
    "AlterClientQuotas": (49, 1, {"entries": [{"entity": [{"entity_type": "user", "entity_name": "carol"}],
                                               "ops": [{"key": "producer_byte_rate", "value": 1e6, "remove": False}]}],
                                  "validate_only": False},
                          lambda r: r.entries[0].error_code, [(CLUSTER, "kafka-cluster", Operation.ALTER_CONFIGS)],
                          CLUSTER_DENIED, ErrorCode.none),
    "DescribeUserScramCredentials": (50, 0, {"users": None}, lambda r: r.error_code,
                                     [(CLUSTER, "kafka-cluster", Operation.DESCRIBE)], CLUSTER_DENIED, ErrorCode.none),
    "AlterUserScramCredentials": (51, 0, {"deletions": [{"name": "carol", "mechanism": 1}], "upsertions": []},
                                  lambda r: r.results[0].error_code, [(CLUSTER, "kafka-cluster", Operation.ALTER)],
                                  CLUSTER_DENIED, ErrorCode.resource_not_found),
    "DescribeCluster": (60, 1, {"include_cluster_authorized_operations": False, "endpoint_type": 1},
                        lambda r: r.error_code, [(CLUSTER, "kafka-cluster", Operation.DESCRIBE)], CLUSTER_DENIED,
                        ErrorCode.none),
}


def test_every_served_api_is_in_the_table(world: World) -> None:
    names = {api.name for key, api in world.broker.apis.items() if key not in OPEN_APIS}
    own = {"StratalogCommitStaged", "StratalogReplaceObjects"}
    # Tests of their own below (ListGroups and ListTransactions leave out what may not be described).
    assert names - set(ROWS) == {"Produce", "ListGroups", "ListTransactions", *own}


@pytest.mark.parametrize("name", sorted(ROWS))
def test_an_api_refuses_a_principal_without_the_acl_and_serves_one_with_it(world: World, name: str) -> None:
    key, version, body, error_of, acls, refused, served = ROWS[name]
    assert ErrorCode(error_of(call(world.broker, world.session["bob"], key, version, body))) == refused
    stream = world.broker.partition("t", 0)
    assert stream is not None and (stream.start_offset, stream.end_offset) == (0, 1), "the log is untouched"
    assert world.broker.topics.get("new") is None and world.broker.authorizer.acls() == [], "nothing created"
    assert world.broker.quotas.entities() == {}
    for resource_type, resource, op in acls:
        world.allow(resource_type, resource, op)
    got = ErrorCode(error_of(call(world.broker, world.session["alice"], key, version, body)))
    if served is not None:
        assert got == served
    else:
        assert got not in (TOPIC_DENIED, GROUP_DENIED, CLUSTER_DENIED)


def commit_staged(world: World, who: str, values: list[bytes]) -> CommitStagedResponse:
    """Stage an object of ``values`` for t/0 as a Spark task would, then ask the broker to commit it."""
    writer = StagingWriter(world.broker.store.object_store, f"{STAGING_PREFIX}w{next(_ids)}/000000-")
    writer.add("t/0", [NewRecord(v) for v in values])
    body = CommitStagedRequest(None, -1, tuple(
        StagedObjectEntry(0, o.key, o.size_bytes, tuple(StagedStreamEntry(s.name, s.start, s.count) for s in o.streams))
        for o in writer.finish()))
    request = Request(STAGED_API_KEY, 0, next(_ids), "test", body, 0)

    async def run() -> Any:
        return await world.broker.apis[STAGED_API_KEY].handler(world.broker, request, world.session[who])

    answer = world.loop.run_until_complete(run())
    return decode_response(b"".join(bytes(p) for p in answer.pieces)[4:])[1]


def test_a_staged_commit_needs_write_on_every_topic_it_writes(world: World) -> None:
    refused = commit_staged(world, "bob", [b"x", b"y"])
    assert (ErrorCode(refused.error_code), refused.committed) == (TOPIC_DENIED, False)
    assert end_offset(world) == 1
    world.allow(TOPIC, "t", Operation.WRITE)
    served = commit_staged(world, "alice", [b"x", b"y"])
    assert (served.error_code, served.committed, served.records) == (0, True, 2)
    assert end_offset(world) == 3


def test_a_staged_commit_naming_too_many_objects_is_refused_before_any_work(world: World) -> None:
    entry = StagedObjectEntry(0, f"{STAGING_PREFIX}w/0.slo", 10, (StagedStreamEntry("t/0", 0, 1),))
    body = CommitStagedRequest(None, -1, (entry,) * (STAGED_OBJECTS_MAX + 1))
    request = Request(STAGED_API_KEY, 0, next(_ids), "test", body, 0)

    async def run() -> Any:
        return await world.broker.apis[STAGED_API_KEY].handler(world.broker, request, world.session["admin"])

    answer = decode_response(b"".join(bytes(p) for p in world.loop.run_until_complete(run()).pieces)[4:])[1]
    assert ErrorCode(answer.error_code) == ErrorCode.invalid_request and "at most" in answer.error_message
    assert end_offset(world) == 1


def test_replacing_objects_needs_alter_on_the_cluster(world: World) -> None:
    objects = world.broker.store.metadata.objects()
    body = ReplaceObjectsRequest(tuple(o.key for o in objects), ((f"{STAGING_PREFIX}c/0.slo", 10),))

    def ask(who: str) -> CommitStagedResponse:
        request = Request(REPLACE_API_KEY, 0, next(_ids), "test", body, 0)

        async def run() -> Any:
            return await world.broker.apis[REPLACE_API_KEY].handler(world.broker, request, world.session[who])

        answer = world.loop.run_until_complete(run())
        return decode_response(b"".join(bytes(p) for p in answer.pieces)[4:])[1]

    assert ErrorCode(ask("bob").error_code) == CLUSTER_DENIED
    world.allow(CLUSTER, "kafka-cluster", Operation.ALTER)
    served = ask("alice")  # authorized: refused only because the staged object is not there
    assert ErrorCode(served.error_code) == ErrorCode.invalid_request and "not replaced" in served.error_message
    assert end_offset(world) == 1


def test_list_groups_shows_only_the_groups_a_principal_may_describe(world: World) -> None:
    world.broker.offsets.commit("g", [])
    call(world.broker, world.session["admin"], *ROWS["OffsetCommit"][:3])
    listed = {g.group_id for g in call(world.broker, world.session["admin"], 16, 4, {"states_filter": []}).groups}
    assert "g" in listed
    assert call(world.broker, world.session["bob"], 16, 4, {"states_filter": []}).groups == ()


def test_list_transactions_shows_only_the_ids_a_principal_may_describe(world: World) -> None:
    error, _, _ = world.loop.run_until_complete(world.broker.transactions.init_producer_id("tx", 60_000, -1, -1))
    assert error == ErrorCode.none
    listing = {"state_filters": [], "producer_id_filters": [], "duration_filter": -1}
    assert call(world.broker, world.session["bob"], 66, 1, listing).transaction_states == ()
    world.allow(TXN, "tx", Operation.DESCRIBE)
    assert [t.transactional_id for t in call(world.broker, world.session["alice"], 66, 1, listing)
            .transaction_states] == ["tx"]


def test_finding_a_transactions_coordinator_needs_describe_on_its_id(world: World) -> None:
    find = {"key_type": 1, "coordinator_keys": ["tx"]}
    assert call(world.broker, world.session["bob"], 10, 4, find).coordinators[0].error_code == TXN_DENIED
    world.allow(TXN, "tx", Operation.DESCRIBE)
    assert call(world.broker, world.session["alice"], 10, 4, find).coordinators[0].error_code == ErrorCode.none


def test_a_refused_produce_appends_nothing_and_a_permitted_one_appends(world: World) -> None:
    assert world.produce("bob", "t") == TOPIC_DENIED
    assert end_offset(world) == 1
    world.allow(TOPIC, "t", Operation.WRITE)
    assert world.produce("alice", "t") == ErrorCode.none
    assert end_offset(world) == 2


def test_a_produce_creates_a_missing_topic_only_for_a_principal_that_may_create_it(world: World) -> None:
    world.allow(TOPIC, "auto", Operation.WRITE, pattern=PatternType.PREFIXED)
    assert world.produce("alice", "auto-1") == ErrorCode.unknown_topic_or_partition
    assert world.broker.topics.get("auto-1") is None
    world.allow(TOPIC, "auto", Operation.CREATE, pattern=PatternType.PREFIXED)
    assert world.produce("alice", "auto-1") == ErrorCode.none


def test_metadata_of_every_topic_leaves_out_the_hidden_ones(world: World) -> None:
    world.broker.create_topic("visible", 1, {})
    world.allow(TOPIC, "visible", Operation.DESCRIBE)
    everything = call(world.broker, world.session["alice"], 3, 12, {
        "topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": False})
    assert [t.name for t in everything.topics] == ["visible"]


def test_super_users_and_the_authorizer_off_see_everything(tmp_path: Path, world: World) -> None:
    assert ErrorCode(call(world.broker, world.session["admin"], *ROWS["DescribeCluster"][:3]).error_code) == 0
    world.broker.authorizer.config = AuthorizerConfig(enabled=False)
    assert ErrorCode(call(world.broker, world.session["bob"], *ROWS["DescribeCluster"][:3]).error_code) == 0
    # ACL management needs the authorizer on (Kafka's SECURITY_DISABLED).
    response = call(world.broker, world.session["admin"], *ROWS["DescribeAcls"][:3])
    assert ErrorCode(response.error_code) == ErrorCode.security_disabled and "--acls" in response.error_message


def test_quotas_set_through_the_admin_api_are_described_back(world: World) -> None:
    alter = ROWS["AlterClientQuotas"]
    assert ErrorCode(call(world.broker, world.session["admin"], alter[0], alter[1], alter[2]).entries[0].error_code) \
        == ErrorCode.none
    described = call(world.broker, world.session["admin"], 48, 1, {"components": [
        {"entity_type": "user", "match_type": 0, "match": "carol"}], "strict": True})
    [entry] = described.entries
    assert [(e.entity_type, e.entity_name) for e in entry.entity] == [("user", "carol")]
    assert [(v.key, v.value) for v in entry.values] == [("producer_byte_rate", 1e6)]
    refused = call(world.broker, world.session["admin"], 49, 1, {"entries": [{"entity": [
        {"entity_type": "user", "entity_name": "carol"}], "ops": [{"key": "request_percentage", "value": 5.0,
                                                                   "remove": False}]}], "validate_only": False})
    assert ErrorCode(refused.entries[0].error_code) == ErrorCode.invalid_request
    assert "request_rate" in refused.entries[0].error_message
