"""Access control lists, and the authorizer that reads them on every request.

An ACL binds a resource pattern (a topic, group or the cluster; a literal name, the wildcard ``*``, or
a prefix) to an entry (a principal such as ``User:alice`` or ``User:*``, a host or ``*``, an operation,
allow or deny), as in Apache Kafka. The rules are Kafka's:

- a super user may do everything;
- a matching DENY wins over any ALLOW;
- ALLOW of Read, Write, Delete or Alter implies Describe; AlterConfigs implies DescribeConfigs; All
  implies every operation;
- a resource that no ACL names at all is refused, unless ``allow_everyone_if_no_acl_found``.

With the authorizer off (the default for a loopback broker) every request is allowed. ACLs are durable
in the broker's metadata (``broker.sqlite``, or PostgreSQL) and held in memory; decisions are cached per
(principal, host, operation, resource) until the ACLs change, so a produce pays a dict lookup per topic.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from stratalog.broker.metadata_db import Location, open_metadata
from stratalog.engine.metadata_backends import Backend, writing
from stratalog.errors import StratalogError

SCHEMA = """
CREATE TABLE IF NOT EXISTS acls (
    resource_type INTEGER NOT NULL,
    resource_name TEXT NOT NULL,
    pattern_type INTEGER NOT NULL,
    principal TEXT NOT NULL,
    host TEXT NOT NULL,
    operation INTEGER NOT NULL,
    permission INTEGER NOT NULL,
    PRIMARY KEY (resource_type, resource_name, pattern_type, principal, host, operation, permission)
);
"""
#: The one name of the cluster resource (Kafka's "kafka-cluster").
CLUSTER_NAME = "kafka-cluster"
WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"
#: Cached decisions; the cache is dropped whole when full (it refills with what is in use).
DECISIONS_CACHED_MAX = 65_536
#: ACLs the broker holds; CreateAcls beyond it is refused (each is checked on requests for its resource).
ACLS_MAX = 100_000


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class Operation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class Permission(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


#: The operations whose ALLOW also allows the key (Kafka's implied operations).
_IMPLIED_BY = {
    Operation.DESCRIBE: frozenset({Operation.DESCRIBE, Operation.READ, Operation.WRITE, Operation.DELETE,
                                   Operation.ALTER, Operation.ALL}),
    Operation.DESCRIBE_CONFIGS: frozenset({Operation.DESCRIBE_CONFIGS, Operation.ALTER_CONFIGS, Operation.ALL}),
}
#: The resource types ACLs are created for, and the operations that mean something on each.
_CONCRETE_TYPES = (ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID)


class InvalidAclError(StratalogError, ValueError):
    """An ACL or filter that cannot be stored or matched: the message says which field."""


@dataclass(frozen=True, slots=True)
class Acl:
    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: Operation
    permission: Permission

    def check(self) -> Acl:
        if self.resource_type not in _CONCRETE_TYPES:
            raise InvalidAclError(f"resource type {self.resource_type.name} cannot have ACLs")
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise InvalidAclError(f"pattern type {self.pattern_type.name}: an ACL is LITERAL or PREFIXED")
        if not self.resource_name:
            raise InvalidAclError("the resource name must not be empty")
        if self.resource_type is ResourceType.CLUSTER and self.resource_name != CLUSTER_NAME:
            raise InvalidAclError(f"the cluster resource is named {CLUSTER_NAME!r}")
        if self.operation in (Operation.UNKNOWN, Operation.ANY):
            raise InvalidAclError(f"operation {self.operation.name}: name one, or ALL")
        if self.permission not in (Permission.ALLOW, Permission.DENY):
            raise InvalidAclError(f"permission {self.permission.name}: an ACL allows or denies")
        if not self.principal.startswith("User:") or len(self.principal) == len("User:"):
            raise InvalidAclError(f"principal {self.principal!r}: expected User:NAME or User:*")
        if not self.host:
            raise InvalidAclError("the host must be an address or '*'")
        return self

    def names(self, resource_type: ResourceType, name: str) -> bool:
        """Whether this ACL's pattern covers the resource."""
        if self.resource_type is not resource_type:
            return False
        if self.pattern_type is PatternType.PREFIXED:
            return name.startswith(self.resource_name)
        return self.resource_name in (name, WILDCARD)


@dataclass(frozen=True, slots=True)
class AclFilter:
    """What DescribeAcls and DeleteAcls select: None and ANY match everything in their field."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: Operation = Operation.ANY
    permission: Permission = Permission.ANY

    def check(self) -> AclFilter:
        for value, what in ((self.resource_type, "resource type"), (self.pattern_type, "pattern type"),
                            (self.operation, "operation"), (self.permission, "permission")):
            if value == 0:
                raise InvalidAclError(f"{what} UNKNOWN cannot be matched")
        return self

    def matches(self, acl: Acl) -> bool:
        if self.resource_type is not ResourceType.ANY and acl.resource_type is not self.resource_type:
            return False
        if not self._matches_pattern(acl):
            return False
        return ((self.principal is None or acl.principal == self.principal)
                and (self.host is None or acl.host == self.host)
                and (self.operation is Operation.ANY or acl.operation is self.operation)
                and (self.permission is Permission.ANY or acl.permission is self.permission))

    def _matches_pattern(self, acl: Acl) -> bool:
        name, pattern = self.resource_name, self.pattern_type
        if pattern is PatternType.MATCH:
            # Every ACL that applies to the resource named: its literal name, the wildcard, the prefixes.
            return name is None or acl.names(acl.resource_type, name)
        if pattern is not PatternType.ANY and acl.pattern_type is not pattern:
            return False
        return name is None or acl.resource_name == name


@dataclass(frozen=True, slots=True)
class AuthorizerConfig:
    #: Check ACLs on every request (Kafka's authorizer.class.name). Off: everything is allowed.
    enabled: bool = False
    #: Principals that may do everything, e.g. ("User:admin",) (super.users).
    super_users: tuple[str, ...] = ()
    #: A resource that no ACL names is open to all (allow.everyone.if.no.acl.found); off: closed.
    allow_everyone_if_no_acl_found: bool = False


@dataclass(slots=True)
class Authorizer:
    """The ACLs, durable, and the decisions made from them. Thread-safe for changes; ``allowed`` runs on
    the event loop. ``location``: ``broker.sqlite``'s path, or a PostgreSQL URI."""

    location: Location
    config: AuthorizerConfig = field(default_factory=AuthorizerConfig)
    _acls: list[Acl] = field(default_factory=list)
    _decisions: dict[tuple[str, str, Operation, ResourceType, str], bool] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _db: Backend | None = None

    def __post_init__(self) -> None:
        self._db = open_metadata(self.location, SCHEMA)
        self._acls = [Acl(ResourceType(r[0]), r[1], PatternType(r[2]), r[3], r[4], Operation(r[5]), Permission(r[6]))
                      for r in self._db.execute("SELECT * FROM acls").fetchall()]

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    @property
    def enabled(self) -> bool:
        return self.config.enabled

    def allowed(self, principal: str, host: str, operation: Operation, resource_type: ResourceType,
                name: str) -> bool:
        if not self.config.enabled or principal in self.config.super_users:
            return True
        key = (principal, host, operation, resource_type, name)
        decision = self._decisions.get(key)
        if decision is None:
            decision = self._decide(principal, host, operation, resource_type, name)
            if len(self._decisions) >= DECISIONS_CACHED_MAX:
                self._decisions.clear()
            self._decisions[key] = decision
        return decision

    def _decide(self, principal: str, host: str, operation: Operation, resource_type: ResourceType,
                name: str) -> bool:
        relevant = [a for a in self._acls if a.names(resource_type, name)]
        if not relevant:
            return self.config.allow_everyone_if_no_acl_found
        mine = [a for a in relevant if a.principal in (principal, WILDCARD_PRINCIPAL) and a.host in (host, WILDCARD)]
        if any(a.permission is Permission.DENY and a.operation in (operation, Operation.ALL) for a in mine):
            return False
        allowing = _IMPLIED_BY.get(operation, frozenset({operation, Operation.ALL}))
        return any(a.permission is Permission.ALLOW and a.operation in allowing for a in mine)

    def allowed_on_some(self, principal: str, host: str, operation: Operation, resource_type: ResourceType) -> bool:
        """Whether an ACL allows ``operation`` on some resource of the type, and no wildcard DENY takes it
        back (Kafka's authorizeByResourceType, as InitProducerId uses it)."""
        if not self.config.enabled or principal in self.config.super_users:
            return True
        mine = [a for a in self._acls if a.resource_type is resource_type
                and a.principal in (principal, WILDCARD_PRINCIPAL) and a.host in (host, WILDCARD)]
        if any(a.permission is Permission.DENY and a.operation in (operation, Operation.ALL)
               and a.pattern_type is PatternType.LITERAL and a.resource_name == WILDCARD for a in mine):
            return False
        allowing = _IMPLIED_BY.get(operation, frozenset({operation, Operation.ALL}))
        return any(a.permission is Permission.ALLOW and a.operation in allowing for a in mine)

    def acls(self, selected: AclFilter | None = None) -> list[Acl]:
        return [a for a in self._acls if selected is None or selected.matches(a)]

    def add(self, acls: Iterable[Acl]) -> None:
        new = [a.check() for a in acls]
        with self._lock:
            fresh = [a for a in dict.fromkeys(new) if a not in self._acls]
            if len(self._acls) + len(fresh) > ACLS_MAX:
                raise InvalidAclError(f"the broker holds at most {ACLS_MAX} ACLs")
            assert self._db is not None
            with writing(self._db):   # all or none: the ACLs held stay those stored
                self._db.executemany("INSERT INTO acls VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                                     [_row(a) for a in fresh])
            self._acls.extend(fresh)
            self._decisions.clear()

    def remove(self, selected: AclFilter) -> list[Acl]:
        """Delete the ACLs the filter matches; returns them."""
        with self._lock:
            doomed = [a for a in self._acls if selected.matches(a)]
            assert self._db is not None
            with writing(self._db):
                self._db.executemany("DELETE FROM acls WHERE resource_type = ? AND resource_name = ? "
                                     "AND pattern_type = ? AND principal = ? AND host = ? AND operation = ? "
                                     "AND permission = ?", [_row(a) for a in doomed])
            gone = set(doomed)
            self._acls = [a for a in self._acls if a not in gone]
            self._decisions.clear()
        return doomed


def _row(a: Acl) -> tuple[int, str, int, str, str, int, int]:
    return (int(a.resource_type), a.resource_name, int(a.pattern_type), a.principal, a.host, int(a.operation),
            int(a.permission))
