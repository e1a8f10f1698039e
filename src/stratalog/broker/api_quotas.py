"""The quota APIs: DescribeClientQuotas and AlterClientQuotas (``kafka-configs --entity-type users`` and
``clients``, any admin client's alter_client_quotas). The rules and the measuring are in ``quotas.py``."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode

from stratalog.broker.acls import Operation
from stratalog.broker.apis import Api
from stratalog.broker.quotas import Entity, QuotaError, check_entity
from stratalog.broker.session import Session
from stratalog.kafka.api_keys import ApiKey
from stratalog.kafka.codec import Request

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker

#: DescribeClientQuotas match types: a name, the default entity, any named (non-default) entity.
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2


def _matches(entity: Entity, components: Any, strict: bool) -> bool:
    names = dict(entity)
    for c in components:
        if c.entity_type not in names:
            return False
        name = names[c.entity_type]
        if c.match_type == MATCH_EXACT and name != c.match:
            return False
        if c.match_type == MATCH_DEFAULT and name is not None:
            return False
        if c.match_type == MATCH_SPECIFIED and name is None:
            return False
    return not strict or len(names) == len(components)


async def describe_client_quotas(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    body = request.body
    if not session.may_cluster(Operation.DESCRIBE_CONFIGS):
        return {"throttle_time": 0, "error_code": ErrorCode.cluster_authorization_failed,
                "error_message": f"{session.principal} may not describe quotas", "entries": None}
    for c in body.components:
        if c.match_type not in (MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED) or \
                (c.match_type == MATCH_EXACT and c.match is None):
            return {"throttle_time": 0, "error_code": ErrorCode.invalid_request,
                    "error_message": f"match type {c.match_type} with match {c.match!r}", "entries": None}
    entries = [{"entity": [{"entity_type": t, "entity_name": n} for t, n in entity],
                "values": [{"key": k, "value": v} for k, v in sorted(values.items())]}
               for entity, values in broker.quotas.entities().items() if _matches(entity, body.components, body.strict)]
    return {"throttle_time": 0, "error_code": ErrorCode.none, "error_message": None, "entries": entries}


async def alter_client_quotas(broker: Broker, request: Request, session: Session) -> dict[str, Any]:
    body = request.body
    allowed = session.may_cluster(Operation.ALTER_CONFIGS)
    results = []
    for entry in body.entries:
        entity_out = [{"entity_type": e.entity_type, "entity_name": e.entity_name} for e in entry.entity]
        result: dict[str, Any] = {"error_code": ErrorCode.none, "error_message": None, "entity": entity_out}
        results.append(result)
        if not allowed:
            result.update(error_code=ErrorCode.cluster_authorization_failed,
                          error_message=f"{session.principal} may not alter quotas")
            continue
        try:
            entity = check_entity((e.entity_type, e.entity_name) for e in entry.entity)
            values = {op.key: op.value for op in entry.ops if not op.remove}
            removed = [op.key for op in entry.ops if op.remove]
            if body.validate_only:
                broker.quotas.check(entity, values, removed)
            else:
                await asyncio.to_thread(broker.quotas.alter, entity, values, removed)
        except QuotaError as e:
            result.update(error_code=ErrorCode.invalid_request, error_message=str(e))
    return {"throttle_time": 0, "entries": results}


APIS = (
    Api(ApiKey.DESCRIBE_CLIENT_QUOTAS, "DescribeClientQuotas", 0, 1, describe_client_quotas),
    Api(ApiKey.ALTER_CLIENT_QUOTAS, "AlterClientQuotas", 0, 1, alter_client_quotas, ordered=True),
)
