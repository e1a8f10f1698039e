"""Kafka's API keys by name: the ``apiKey`` of each request schema in Apache Kafka's
``clients/src/main/resources/common/message/*Request.json``, for the APIs this project speaks. The broker's
own APIs (``kafka.staged_commit``) have keys far above these."""

from __future__ import annotations

from enum import IntEnum


class ApiKey(IntEnum):
    """An API's key, as a request header carries it. An int: a dict keyed by ints finds it, and it formats
    as its number."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    DESCRIBE_GROUPS = 15
    LIST_GROUPS = 16
    SASL_HANDSHAKE = 17
    API_VERSIONS = 18
    CREATE_TOPICS = 19
    DELETE_TOPICS = 20
    DELETE_RECORDS = 21
    INIT_PRODUCER_ID = 22
    OFFSET_FOR_LEADER_EPOCH = 23
    ADD_PARTITIONS_TO_TXN = 24
    ADD_OFFSETS_TO_TXN = 25
    END_TXN = 26
    TXN_OFFSET_COMMIT = 28
    DESCRIBE_ACLS = 29
    CREATE_ACLS = 30
    DELETE_ACLS = 31
    DESCRIBE_CONFIGS = 32
    ALTER_CONFIGS = 33
    SASL_AUTHENTICATE = 36
    CREATE_PARTITIONS = 37
    DELETE_GROUPS = 42
    INCREMENTAL_ALTER_CONFIGS = 44
    DESCRIBE_CLIENT_QUOTAS = 48
    ALTER_CLIENT_QUOTAS = 49
    DESCRIBE_USER_SCRAM_CREDENTIALS = 50
    ALTER_USER_SCRAM_CREDENTIALS = 51
    DESCRIBE_CLUSTER = 60
    DESCRIBE_PRODUCERS = 61
    DESCRIBE_TRANSACTIONS = 65
    LIST_TRANSACTIONS = 66


def api_label(api_key: int) -> str:
    """Kafka's name of an API with its key (``EndTxn (API 26)``), served here or not; ``API <key>`` for a
    key Kafka has no API for. For log lines about requests this broker refuses."""
    from kio.schema.index import api_key_map

    name = api_key_map.get(api_key)
    return f"{''.join(part.title() for part in name.split('_'))} (API {api_key})" if name else f"API {api_key}"
