"""ACLs through Kafka's admin APIs (DescribeAcls, CreateAcls, DeleteAcls): list, create, delete.

Each function takes a confluent-kafka AdminClient and returns plain data (dicts and lists, ready for a
table or JSON); a broker's refusal is an AdminError naming what was asked and Kafka's error. An ACL is
written as the command line writes it: operations as Kafka's tool spells them (``Read``, ``ClusterAction``),
resource types, pattern types and permissions in lower case (``topic``, ``prefixed``, ``allow``).

librdkafka answers a refused DescribeAcls (no authorizer, no permission) with an empty list, as if there
were no ACLs: ``list_acls`` asks the broker again, over stratalog's own client, why a list is empty.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stratalog.admin.connect import REQUEST_TIMEOUT_S, AdminError, answer

#: Operations as Kafka's kafka-acls spells them, each with the name of its AclOperation member.
OPERATIONS = {"Read": "READ", "Write": "WRITE", "Create": "CREATE", "Delete": "DELETE", "Alter": "ALTER",
              "Describe": "DESCRIBE", "ClusterAction": "CLUSTER_ACTION", "DescribeConfigs": "DESCRIBE_CONFIGS",
              "AlterConfigs": "ALTER_CONFIGS", "IdempotentWrite": "IDEMPOTENT_WRITE", "All": "ALL"}
#: Resource types ACLs name, each with its ResourceType member (Kafka's cluster is librdkafka's BROKER).
RESOURCE_TYPES = {"topic": "TOPIC", "group": "GROUP", "cluster": "BROKER", "transactional-id": "TRANSACTIONAL_ID"}
#: How an ACL's name covers resources; a filter may also ask for any pattern, or for every ACL that applies
#: to a name (``match``: the literal name, the wildcard ``*`` and every prefix of it).
PATTERNS = ("literal", "prefixed")
FILTER_PATTERNS = (*PATTERNS, "any", "match")
PERMISSIONS = ("allow", "deny")
#: The one name of the cluster resource.
CLUSTER_NAME = "kafka-cluster"
#: A host or principal that stands for every one.
WILDCARD = "*"
#: The DescribeAcls version stratalog's own client sends: flexible, with pattern types (Kafka 2.4 and later).
DESCRIBE_ACLS_VERSION = 2


@dataclass(frozen=True)
class AclFilter:
    """Which ACLs a list or delete selects: None (or ``any``) matches every value of its field."""

    principal: str | None = None
    host: str | None = None
    #: Names of OPERATIONS; empty: any operation.
    operations: tuple[str, ...] = ()
    #: A key of RESOURCE_TYPES, or None for any.
    resource_type: str | None = None
    resource_name: str | None = None
    pattern: str = "any"
    #: ``allow``, ``deny``, or None for either.
    permission: str | None = None

    def bindings(self) -> list[Any]:
        """confluent-kafka AclBindingFilters, one per operation (a filter names one or any)."""
        from confluent_kafka.admin import (
            AclBindingFilter,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        restype = ResourceType[RESOURCE_TYPES[self.resource_type]] if self.resource_type else ResourceType.ANY
        permission = AclPermissionType[self.permission.upper()] if self.permission else AclPermissionType.ANY
        operations = [AclOperation[OPERATIONS[op]] for op in self.operations] or [AclOperation.ANY]
        # None matches any name, principal or host: confluent-kafka documents it, though its hints say str.
        make: Any = AclBindingFilter
        return [make(restype, self.resource_name, ResourcePatternType[self.pattern.upper()], self.principal,
                     self.host, operation, permission) for operation in operations]

    def describe(self) -> str:
        """The filter in words, for messages: ``the ACLs of principal User:bob, topic events``."""
        parts = [f"principal {self.principal}" if self.principal else "",
                 f"host {self.host}" if self.host else "",
                 f"operation {'/'.join(self.operations)}" if self.operations else "",
                 f"{self.resource_type} {self.resource_name or ''}".strip() if self.resource_type else "",
                 f"{self.pattern} pattern" if self.pattern != "any" else "",
                 self.permission or ""]
        chosen = ", ".join(p for p in parts if p)
        return f"the ACLs of {chosen}" if chosen else "every ACL"


def row(binding: Any) -> dict[str, Any]:
    """An AclBinding as a row: principal, host, operation, permission, resource type, name and pattern type."""
    spelled = {member: name for name, member in OPERATIONS.items()}
    types = {member: name for name, member in RESOURCE_TYPES.items()}
    return {"principal": binding.principal, "host": binding.host,
            "operation": spelled.get(binding.operation.name, binding.operation.name),
            "permission": binding.permission_type.name.lower(),
            "resource_type": types.get(binding.restype.name, binding.restype.name.lower()),
            "resource_name": binding.name, "pattern_type": binding.resource_pattern_type.name.lower()}


def _sorted(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    unique = {tuple(r.values()): r for r in rows}
    return [unique[k] for k in sorted(unique, key=lambda k: tuple(str(v) for v in k))]


def list_acls(admin: Any, selected: AclFilter = AclFilter(),
              settings: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Every ACL the filter selects, as rows, sorted by principal. librdkafka answers a refused DescribeAcls
    (no authorizer, or no permission to describe) with an empty list, as if there were no ACLs: with the
    client's ``settings``, an empty answer is asked again over stratalog's own client, to learn which."""
    rows = []
    filters = selected.bindings()
    what = f"list {selected.describe()}"
    for binding_filter in filters:
        found = answer(admin, admin.describe_acls(binding_filter, request_timeout=REQUEST_TIMEOUT_S), what)
        rows += [row(b) for b in found]
    if not rows and settings is not None:
        _why_empty(settings, filters[0], what)
    return _sorted(rows)


def _why_empty(settings: Mapping[str, str], binding_filter: Any, what: str) -> None:
    """AdminError with the broker's error when it refuses DescribeAcls (v2: flexible, with pattern types)."""
    from kio.schema.describe_acls.v2.request import DescribeAclsRequest
    from kio.static.primitive import i8

    from stratalog.admin.quotas import broker_error, call
    from stratalog.kafka.api_keys import ApiKey

    request = DescribeAclsRequest(
        resource_type_filter=i8(binding_filter.restype.value), resource_name_filter=binding_filter.name,
        pattern_type_filter=i8(binding_filter.resource_pattern_type.value), principal_filter=binding_filter.principal,
        host_filter=binding_filter.host, operation=i8(binding_filter.operation.value),
        permission_type=i8(binding_filter.permission_type.value))
    try:
        response = call(settings, ApiKey.DESCRIBE_ACLS, DESCRIBE_ACLS_VERSION, request, what)
    except AdminError:
        return  # settings only librdkafka knows (a GSSAPI login, say): its answer is all there is
    if response.error_code != 0:
        raise broker_error(what, response.error_code, response.error_message)


def create_acls(admin: Any, operations: Sequence[str], resource_type: str, resource_name: str,
                allow: Sequence[str] = (), deny: Sequence[str] = (), pattern: str = "literal",
                host: str = WILDCARD) -> list[dict[str, Any]]:
    """One ACL per principal (allowed or denied) and operation on one resource pattern; the ACLs created,
    as rows."""
    from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, ResourcePatternType, ResourceType

    if not (allow or deny) or not operations:
        raise AdminError("an ACL needs a principal to allow or deny, and an operation")
    if pattern not in PATTERNS:
        raise AdminError(f"pattern {pattern!r}: an ACL's pattern is one of {', '.join(PATTERNS)}")
    entries = [(AclPermissionType.ALLOW, p) for p in allow] + [(AclPermissionType.DENY, p) for p in deny]
    bindings = list(dict.fromkeys(  # a principal or operation named twice is one ACL
        AclBinding(ResourceType[RESOURCE_TYPES[resource_type]], resource_name, ResourcePatternType[pattern.upper()],
                   principal, host, AclOperation[OPERATIONS[op]], permission)
        for permission, principal in entries for op in operations))
    futures = admin.create_acls(bindings, request_timeout=REQUEST_TIMEOUT_S)
    for binding in bindings:
        answer(admin, futures[binding], f"create the ACL {_words(row(binding))}")
    return [row(b) for b in bindings]


def delete_acls(admin: Any, selected: AclFilter) -> list[dict[str, Any]]:
    """Delete every ACL the filter selects; the ACLs deleted, as rows."""
    filters = selected.bindings()
    futures = admin.delete_acls(filters, request_timeout=REQUEST_TIMEOUT_S)
    rows = []
    for binding_filter in filters:
        rows += [row(b) for b in answer(admin, futures[binding_filter], f"delete {selected.describe()}")]
    return _sorted(rows)


def _words(acl: dict[str, Any]) -> str:
    return (f"{acl['permission']} {acl['principal']} {acl['operation']} on {acl['resource_type']} "
            f"{acl['resource_name']} ({acl['pattern_type']}, host {acl['host']})")
