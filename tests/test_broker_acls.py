"""The authorizer's rules, one test per rule, against ACLs held in a real SQLite file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stratalog.broker.acls import (
    ACLS_MAX,
    Acl,
    AclFilter,
    Authorizer,
    AuthorizerConfig,
    InvalidAclError,
    Operation,
    PatternType,
    Permission,
    ResourceType,
)

TOPIC, GROUP, CLUSTER = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED
ALLOW, DENY = Permission.ALLOW, Permission.DENY


def acl(name: str, op: Operation, permission: Permission = ALLOW, *, principal: str = "User:alice",
        resource_type: ResourceType = TOPIC, pattern: PatternType = LITERAL, host: str = "*") -> Acl:
    return Acl(resource_type, name, pattern, principal, host, op, permission)


@pytest.fixture
def authorizer(tmp_path: Path) -> Iterator[Authorizer]:
    made = Authorizer(tmp_path / "broker.sqlite", AuthorizerConfig(enabled=True, super_users=("User:root",)))
    yield made
    made.close()


def may(a: Authorizer, op: Operation, name: str = "orders", *, principal: str = "User:alice",
        resource_type: ResourceType = TOPIC, host: str = "10.0.0.1") -> bool:
    return a.allowed(principal, host, op, resource_type, name)


def test_with_the_authorizer_off_everything_is_allowed(tmp_path: Path) -> None:
    off = Authorizer(tmp_path / "broker.sqlite", AuthorizerConfig(enabled=False))
    try:
        off.add([acl("orders", Operation.READ, DENY)])
        assert may(off, Operation.READ) and may(off, Operation.ALTER, resource_type=CLUSTER, name="kafka-cluster")
    finally:
        off.close()


def test_a_resource_no_acl_names_is_closed_unless_configured_open(tmp_path: Path, authorizer: Authorizer) -> None:
    assert not may(authorizer, Operation.READ)
    open_ = Authorizer(tmp_path / "open.sqlite", AuthorizerConfig(enabled=True, allow_everyone_if_no_acl_found=True))
    try:
        assert may(open_, Operation.READ)
        open_.add([acl("orders", Operation.WRITE, principal="User:bob")])
        assert not may(open_, Operation.READ), "once an ACL names the resource, only ACLs decide"
    finally:
        open_.close()


def test_super_users_may_do_everything(authorizer: Authorizer) -> None:
    authorizer.add([acl("orders", Operation.ALL, DENY, principal="User:*")])
    assert may(authorizer, Operation.DELETE, principal="User:root")


def test_a_literal_allow_gives_that_operation_on_that_name_only(authorizer: Authorizer) -> None:
    authorizer.add([acl("orders", Operation.READ)])
    assert may(authorizer, Operation.READ)
    assert not may(authorizer, Operation.WRITE)
    assert not may(authorizer, Operation.READ, "orders2")
    assert not may(authorizer, Operation.READ, principal="User:bob")


def test_a_prefixed_acl_covers_every_name_it_starts(authorizer: Authorizer) -> None:
    authorizer.add([acl("team-a.", Operation.WRITE, pattern=PREFIXED)])
    assert may(authorizer, Operation.WRITE, "team-a.orders") and may(authorizer, Operation.WRITE, "team-a.")
    assert not may(authorizer, Operation.WRITE, "team-b.orders")


def test_the_wildcard_name_and_principal_match_all(authorizer: Authorizer) -> None:
    authorizer.add([acl("*", Operation.READ, principal="User:*")])
    assert may(authorizer, Operation.READ, "anything", principal="User:anyone")


def test_deny_wins_over_allow(authorizer: Authorizer) -> None:
    authorizer.add([acl("orders", Operation.ALL), acl("orders", Operation.WRITE, DENY)])
    assert may(authorizer, Operation.READ)
    assert not may(authorizer, Operation.WRITE)


def test_a_host_acl_applies_to_that_address_only(authorizer: Authorizer) -> None:
    authorizer.add([acl("orders", Operation.READ, host="10.0.0.1")])
    assert may(authorizer, Operation.READ, host="10.0.0.1")
    assert not may(authorizer, Operation.READ, host="10.0.0.2")


def test_read_write_delete_and_alter_imply_describe_and_alter_configs_implies_describe_configs(
        authorizer: Authorizer) -> None:
    for i, op in enumerate((Operation.READ, Operation.WRITE, Operation.DELETE, Operation.ALTER)):
        authorizer.add([acl(f"t{i}", op)])
        assert may(authorizer, Operation.DESCRIBE, f"t{i}"), op
    authorizer.add([acl("configs", Operation.ALTER_CONFIGS)])
    assert may(authorizer, Operation.DESCRIBE_CONFIGS, "configs")
    assert not may(authorizer, Operation.DESCRIBE, "configs")


def test_acls_of_one_resource_type_do_not_apply_to_another(authorizer: Authorizer) -> None:
    authorizer.add([acl("orders", Operation.READ, resource_type=GROUP)])
    assert may(authorizer, Operation.READ, resource_type=GROUP)
    assert not may(authorizer, Operation.READ)


def test_a_change_takes_effect_at_once_though_decisions_are_cached(authorizer: Authorizer) -> None:
    authorizer.add([acl("orders", Operation.READ)])
    assert may(authorizer, Operation.READ)
    authorizer.add([acl("orders", Operation.READ, DENY)])
    assert not may(authorizer, Operation.READ)
    authorizer.remove(AclFilter(permission=DENY))
    assert may(authorizer, Operation.READ)


def test_acls_survive_a_restart(tmp_path: Path, authorizer: Authorizer) -> None:
    authorizer.add([acl("orders", Operation.READ), acl("team.", Operation.WRITE, pattern=PREFIXED)])
    authorizer.close()
    again = Authorizer(tmp_path / "broker.sqlite", AuthorizerConfig(enabled=True))
    try:
        assert sorted(again.acls(), key=str) == sorted(
            [acl("orders", Operation.READ), acl("team.", Operation.WRITE, pattern=PREFIXED)], key=str)
    finally:
        again.close()


def test_filters_select_as_describe_and_delete_acls_do(authorizer: Authorizer) -> None:
    lit, pre, wild = (acl("orders", Operation.READ), acl("ord", Operation.WRITE, pattern=PREFIXED),
                      acl("*", Operation.DESCRIBE))
    other = acl("orders", Operation.READ, resource_type=GROUP)
    authorizer.add([lit, pre, wild, other])
    assert authorizer.acls(AclFilter(TOPIC, "orders", PatternType.MATCH)) == [lit, pre, wild]
    assert authorizer.acls(AclFilter(TOPIC, "orders", PatternType.ANY)) == [lit]
    assert authorizer.acls(AclFilter(TOPIC, "ord", PREFIXED)) == [pre]
    assert authorizer.acls(AclFilter(operation=Operation.READ)) == [lit, other]
    assert authorizer.remove(AclFilter(ResourceType.ANY, "orders")) == [lit, other]
    assert authorizer.acls() == [pre, wild]


@pytest.mark.parametrize(("bad", "named"), [
    (acl("orders", Operation.ANY), "operation"),
    (acl("orders", Operation.READ, Permission.ANY), "permission"),
    (acl("orders", Operation.READ, pattern=PatternType.MATCH), "pattern"),
    (acl("orders", Operation.READ, principal="alice"), "principal"),
    (acl("x", Operation.ALTER, resource_type=CLUSTER), "kafka-cluster"),
    (acl("", Operation.READ), "name"),
    (acl("orders", Operation.READ, resource_type=ResourceType.ANY), "resource type"),
])
def test_an_acl_that_cannot_match_is_refused_with_its_field_named(authorizer: Authorizer, bad: Acl,
                                                                   named: str) -> None:
    with pytest.raises(InvalidAclError, match=named):
        authorizer.add([bad])
    assert authorizer.acls() == []


def test_the_acl_count_is_bounded(authorizer: Authorizer, monkeypatch: pytest.MonkeyPatch) -> None:
    import stratalog.broker.acls as acls_module

    monkeypatch.setattr(acls_module, "ACLS_MAX", 3)
    authorizer.add([acl(f"t{i}", Operation.READ) for i in range(3)])
    with pytest.raises(InvalidAclError, match="at most 3"):
        authorizer.add([acl("t9", Operation.READ)])
    assert ACLS_MAX >= 10_000


def test_idempotent_write_needs_the_cluster_or_write_on_some_topic(authorizer: Authorizer) -> None:
    assert not authorizer.allowed_on_some("User:alice", "h", Operation.WRITE, TOPIC)
    authorizer.add([acl("team.", Operation.WRITE, pattern=PREFIXED)])
    assert authorizer.allowed_on_some("User:alice", "h", Operation.WRITE, TOPIC)
    authorizer.add([acl("*", Operation.WRITE, DENY)])
    assert not authorizer.allowed_on_some("User:alice", "h", Operation.WRITE, TOPIC)
