"""Client quotas through Kafka's DescribeClientQuotas and AlterClientQuotas (version 1, flexible).

librdkafka sends neither, so these go through stratalog's own small Kafka client (kafka/client.py), logged in
with the same settings (librdkafka's names) as the other admin commands. A quota entity is a user, a client
id, or both; a name of None is that type's default entity (``<default>`` in a table). Values are Kafka's
doubles: ``producer_byte_rate``, ``consumer_byte_rate``, and whatever else the broker knows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stratalog.admin.connect import REQUEST_TIMEOUT_S, AdminError

#: The entity types, in the order an entity is written (Kafka's: the user first).
USER, CLIENT_ID = "user", "client-id"
ENTITY_TYPES = (USER, CLIENT_ID)
#: How a default entity's name is shown.
DEFAULT = "<default>"
#: The version of both APIs sent: Kafka's latest, and the broker's.
API_VERSION = 1
#: DescribeClientQuotas match types: an exact name, the default entity.
MATCH_EXACT, MATCH_DEFAULT = 0, 1
#: The client id these requests carry.
CLIENT_ID_SENT = "stratalog-admin"

#: An entity: (type, name) pairs in ENTITY_TYPES' order; a name of None is the default.
Entity = tuple[tuple[str, str | None], ...]


def entity_of(user: str | None = None, default_user: bool = False, client_id: str | None = None,
              default_client_id: bool = False) -> Entity:
    """The entity the options name (empty when none do); AdminError for a name and its default at once."""
    if user is not None and default_user:
        raise AdminError("a user or the default user, not both")
    if client_id is not None and default_client_id:
        raise AdminError("a client id or the default client id, not both")
    entity: list[tuple[str, str | None]] = []
    if user is not None or default_user:
        entity.append((USER, user))
    if client_id is not None or default_client_id:
        entity.append((CLIENT_ID, client_id))
    return tuple(entity)


def entity_text(entity: Entity) -> str:
    """``user=alice, client-id=<default>``."""
    return ", ".join(f"{kind}={DEFAULT if name is None else name}" for kind, name in entity)


def _value(value: float) -> float | int:
    """A whole number as an int (a byte rate of 1048576, not 1048576.0)."""
    return int(value) if float(value).is_integer() else float(value)


def _ordered(components: Sequence[tuple[str, str | None]]) -> Entity:
    return tuple(sorted(components, key=lambda c: (ENTITY_TYPES.index(c[0]) if c[0] in ENTITY_TYPES
                                                   else len(ENTITY_TYPES), c[0])))


def call(settings: Mapping[str, str], api_key: int, api_version: int, body: Any, what: str) -> Any:
    """One request of Kafka's schemas (a kio dataclass) over stratalog's own client, logged in as
    ``settings`` say; its response. AdminError naming ``what`` when the connection or the login fails."""
    from stratalog.kafka.client import BrokerConnectionError, KafkaConnection

    bootstrap = settings["bootstrap.servers"]
    try:
        with KafkaConnection(bootstrap, dict(settings), client_id=CLIENT_ID_SENT,
                             timeout_s=REQUEST_TIMEOUT_S) as connection:
            return connection.call(api_key, api_version, body)
    except (BrokerConnectionError, OSError) as e:
        raise AdminError(f"{what}: {bootstrap}: {e}") from None


def broker_error(what: str, code: int, message: str | None) -> AdminError:
    """A response's error code as Kafka's name for it (INVALID_REQUEST), with the broker's message."""
    from kio.schema.errors import ErrorCode

    try:
        name = ErrorCode(code).name.upper()
    except ValueError:
        name = f"error {code}"
    return AdminError(f"{what}: {name}: {message}" if message else f"{what}: {name}")


def describe_quotas(settings: Mapping[str, str], entity: Entity = ()) -> list[dict[str, Any]]:
    """The quotas of every entity that has the components of ``entity`` (all of them when it is empty; a
    user's include those of the user with a client id): each ``{"entity": {type: name}, "quotas": {key:
    value}}``, sorted by entity."""
    from kio.schema.describe_client_quotas.v1.request import ComponentData, DescribeClientQuotasRequest
    from kio.static.primitive import i8

    from stratalog.kafka.api_keys import ApiKey

    components = tuple(ComponentData(entity_type=kind, match_type=i8(MATCH_DEFAULT if name is None else MATCH_EXACT),
                                     match=name) for kind, name in entity)
    what = f"describe the quotas of {entity_text(entity) or 'every entity'}"
    response = call(settings, ApiKey.DESCRIBE_CLIENT_QUOTAS, API_VERSION,
                    DescribeClientQuotasRequest(components=components, strict=False), what)
    if response.error_code != 0:
        raise broker_error(what, response.error_code, response.error_message)
    found = []
    for entry in response.entries or ():
        ordered = _ordered([(e.entity_type, e.entity_name) for e in entry.entity])
        found.append((ordered, {v.key: _value(v.value) for v in sorted(entry.values, key=lambda v: v.key)}))
    found.sort(key=lambda f: [(kind, name is not None, name or "") for kind, name in f[0]])
    return [{"entity": dict(e), "quotas": quotas} for e, quotas in found]


def rows(described: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """describe_quotas' answer as table rows: entity (``user=alice, client-id=<default>``), quota, value."""
    return [{"entity": entity_text(_ordered(list(doc["entity"].items()))), "quota": key, "value": value}
            for doc in described for key, value in doc["quotas"].items()]


def alter_quotas(settings: Mapping[str, str], entity: Entity, set_values: Mapping[str, float] | None = None,
                 delete: Sequence[str] = (), validate_only: bool = False) -> None:
    """Set and delete quotas of one entity (AlterClientQuotas); AdminError with the broker's message when
    it refuses (an unknown key, a value out of range, no permission)."""
    from kio.schema.alter_client_quotas.v1.request import AlterClientQuotasRequest, EntityData, EntryData, OpData
    from kio.static.primitive import f64

    from stratalog.kafka.api_keys import ApiKey

    if not entity:
        raise AdminError("name the entity whose quotas change: a user, a client id, or both")
    ops = tuple(OpData(key=k, value=f64(float(v)), remove=False) for k, v in (set_values or {}).items())
    ops += tuple(OpData(key=k, value=f64(0.0), remove=True) for k in delete)
    if not ops:
        raise AdminError("nothing to change: set or delete a quota")
    request = AlterClientQuotasRequest(entries=(EntryData(
        entity=tuple(EntityData(entity_type=kind, entity_name=name) for kind, name in entity), ops=ops),),
        validate_only=validate_only)
    what = f"alter the quotas of {entity_text(entity)}"
    response = call(settings, ApiKey.ALTER_CLIENT_QUOTAS, API_VERSION, request, what)
    for entry in response.entries:
        if entry.error_code != 0:
            raise broker_error(what, entry.error_code, entry.error_message)
