"""`stratalog acls` and `stratalog quotas` against a live stratalog broker with SASL and ACLs on: the CLI
logs in as the super user through a client properties file; an ACL it creates lets a second user read a
topic it was refused, and deleting the ACL refuses it again; quotas are set, described, deleted, for a user,
a user's client id and the default user; the broker's refusals and a wrong password are clear errors."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from click.testing import CliRunner, Result

from brokerkit import running_broker
from stratalog.admin.connect import REQUEST_TIMEOUT_S, read_properties
from stratalog.cli import cli

pytestmark = pytest.mark.slow

PASSWORDS = {"admin": "admin-secret", "bob": "bob-secret"}
MECHANISM = "SCRAM-SHA-256"
#: Wide enough for every column of an ACL table (rich shortens cells to the terminal's width, 80 by default).
TABLE_ENV = {"COLUMNS": "200"}


@dataclass(frozen=True)
class Cluster:
    bootstrap: str
    #: A client properties file per user, and one with the admin's name and a wrong password.
    admin: Path
    bob: Path
    wrong: Path


def add_user(data_dir: Path, name: str, password: str) -> None:
    subprocess.run([sys.executable, "-c", "from stratalog.cli import main; main()", "users", "add", name,
                    "--password-stdin", "--data-dir", str(data_dir)], input=password + "\n", text=True,
                   check=True, capture_output=True, timeout=60)


def properties(path: Path, user: str, password: str) -> Path:
    path.write_text("# a client properties file, as Kafka's tools take one\n"
                    f"security.protocol=SASL_PLAINTEXT\nsasl.mechanism={MECHANISM}\n"
                    f"sasl.username={user}\nsasl.password={password}\n")
    return path


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("acls-quotas")
    data = root / "data"
    for user, password in PASSWORDS.items():
        add_user(data, user, password)
    with running_broker(data, "--listen", "SASL_PLAINTEXT://127.0.0.1:0", "--acls",
                        "--super-user", "User:admin") as broker:
        yield Cluster(broker.listeners()["SASL_PLAINTEXT"],
                      properties(root / "admin.properties", "admin", PASSWORDS["admin"]),
                      properties(root / "bob.properties", "bob", PASSWORDS["bob"]),
                      properties(root / "wrong.properties", "admin", "not-the-password"))
        assert broker.stop() == 0, "".join(broker.output)


def run(cluster: Cluster, *args: str, config: Path | None = None, stdin: str | None = None,
        exit_code: int = 0) -> Result:
    login = config if config is not None else cluster.admin
    result = CliRunner(env=TABLE_ENV).invoke(
        cli, [*args, "--bootstrap", cluster.bootstrap, "--command-config", str(login)], input=stdin,
        catch_exceptions=False)
    assert result.exit_code == exit_code, result.output
    return result


def run_json(cluster: Cluster, *args: str) -> Any:
    return json.loads(run(cluster, *args, "-o", "json").stdout)


def name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def metadata_error(cluster: Cluster, login: Path, topic: str) -> str | None:
    """The error Metadata answers ``login``'s user for ``topic`` (None: the topic is visible to it)."""
    consumer = confluent_kafka.Consumer({**read_properties(login), "bootstrap.servers": cluster.bootstrap,
                                         "group.id": "metadata-only", "enable.auto.commit": False})
    try:
        found = consumer.list_topics(topic, timeout=REQUEST_TIMEOUT_S).topics[topic]
    finally:
        consumer.close()
    return None if found.error is None else str(found.error.name())


def read(cluster: Cluster, login: Path, topic: str, count: int) -> tuple[list[bytes], set[str]]:
    """The first ``count`` records of ``topic``'s partition 0 as ``login``'s user reads them (assigned, not
    subscribed), and the errors met on the way. librdkafka asks for its group's coordinator even when it only
    assigns, so a user without a group ACL may meet GROUP_AUTHORIZATION_FAILED, and reads all the same."""
    consumer = confluent_kafka.Consumer({**read_properties(login), "bootstrap.servers": cluster.bootstrap,
                                         "group.id": name("assigned"), "enable.auto.commit": False})
    values: list[bytes] = []
    errors: set[str] = set()
    deadline = time.monotonic() + REQUEST_TIMEOUT_S
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, confluent_kafka.OFFSET_BEGINNING)])
        while len(values) < count and time.monotonic() < deadline:
            message = consumer.poll(1.0)   # returns as soon as a record or an error comes
            if message is None:
                continue
            error = message.error()
            if error is not None:
                errors.add(error.name())
            else:
                values.append(message.value() or b"")
    finally:
        consumer.close()
    return values, errors


def acl(principal: str, operation: str, topic: str, permission: str = "allow",
        pattern: str = "literal") -> dict[str, str]:
    return {"principal": principal, "host": "*", "operation": operation, "permission": permission,
            "resource_type": "topic", "resource_name": topic, "pattern_type": pattern}


def test_an_acl_lets_a_user_read_a_topic_until_it_is_deleted(cluster: Cluster) -> None:
    topic = name("ledger")
    run(cluster, "topics", "create", topic)
    run(cluster, "produce", topic, stdin="a\nb\nc\n")
    assert metadata_error(cluster, cluster.bob, topic) == "TOPIC_AUTHORIZATION_FAILED"
    refused = run(cluster, "consume", topic, "--from-beginning", "-n", "3", config=cluster.bob, exit_code=1)
    assert topic in refused.output

    created = run(cluster, "acls", "create", "--allow", "User:bob", "--operation", "Read", "--operation", "describe",
                  "--topic", topic)
    assert "created 2 ACLs" in created.output
    assert run_json(cluster, "acls", "list", "--principal", "User:bob", "--topic", topic) == \
        [acl("User:bob", "Describe", topic), acl("User:bob", "Read", topic)]
    table = run(cluster, "acls", "list", "--topic", topic).stdout
    assert table.count("User:bob") == 2 and "Read" in table and "Describe" in table
    assert run_json(cluster, "acls", "list", "--principal", "User:bob", "--operation", "READ") == \
        [acl("User:bob", "Read", topic)]

    assert metadata_error(cluster, cluster.bob, topic) is None
    values, errors = read(cluster, cluster.bob, topic, 3)
    assert values == [b"a", b"b", b"c"]
    assert errors <= {"GROUP_AUTHORIZATION_FAILED"}, "the topic's ACLs let bob fetch; it has none on groups"

    assert "deleted 2 ACLs" in run(cluster, "acls", "delete", "--principal", "User:bob", "--topic", topic,
                                   "--yes").output
    assert run_json(cluster, "acls", "list", "--topic", topic) == []
    assert metadata_error(cluster, cluster.bob, topic) == "TOPIC_AUTHORIZATION_FAILED"


def test_delete_shows_what_it_would_delete_and_asks_first(cluster: Cluster) -> None:
    topic = name("asked")
    run(cluster, "acls", "create", "--allow", "User:carol", "--operation", "Write", "--topic", topic)
    declined = run(cluster, "acls", "delete", "--topic", topic, stdin="n\n", exit_code=1)
    assert "User:carol" in declined.output and "delete this ACL?" in declined.output
    assert run_json(cluster, "acls", "list", "--topic", topic) == [acl("User:carol", "Write", topic)]
    assert "deleted 1 ACL" in run(cluster, "acls", "delete", "--topic", topic, stdin="y\n").output
    assert run_json(cluster, "acls", "list", "--topic", topic) == []
    assert "nothing to delete" in run(cluster, "acls", "delete", "--topic", topic).output


def test_prefixed_deny_and_cluster_acls_and_the_filters_that_find_them(cluster: Cluster) -> None:
    prefix = name("secret") + "-"
    run(cluster, "acls", "create", "--deny", "User:dave", "--operation", "all", "--topic", prefix,
        "--pattern", "prefixed")
    run(cluster, "acls", "create", "--allow", "User:dave", "--operation", "IdempotentWrite", "--cluster")
    denied = acl("User:dave", "All", prefix, permission="deny", pattern="prefixed")
    assert run_json(cluster, "acls", "list", "--topic", prefix, "--pattern", "prefixed") == [denied]
    assert run_json(cluster, "acls", "list", "--topic", prefix, "--pattern", "literal") == []
    # match: every ACL that applies to the topic named, its prefixes included.
    assert run_json(cluster, "acls", "list", "--topic", prefix + "payroll", "--pattern", "match") == [denied]
    assert run_json(cluster, "acls", "list", "--principal", "User:dave", "--permission", "deny") == [denied]
    assert run_json(cluster, "acls", "list", "--cluster") == [
        {"principal": "User:dave", "host": "*", "operation": "IdempotentWrite", "permission": "allow",
         "resource_type": "cluster", "resource_name": "kafka-cluster", "pattern_type": "literal"}]
    assert "deleted 2 ACLs" in run(cluster, "acls", "delete", "--principal", "User:dave", "--yes").output
    assert run_json(cluster, "acls", "list", "--principal", "User:dave") == []


def test_acl_input_the_cli_refuses_before_asking_the_broker(cluster: Cluster) -> None:
    unknown = run(cluster, "acls", "create", "--allow", "User:bob", "--operation", "Fly", "--topic", "t",
                  exit_code=2)
    assert "'Fly' is not one of Read, Write, Create, Delete, Alter, Describe, ClusterAction" in unknown.output
    no_type = run(cluster, "acls", "create", "--allow", "bob", "--operation", "Read", "--topic", "t", exit_code=2)
    assert "expected TYPE:NAME" in no_type.output
    two = run(cluster, "acls", "create", "--allow", "User:bob", "--operation", "Read", "--topic", "t", "--group", "g",
              exit_code=2)
    assert "name one resource" in two.output
    assert "select the ACLs to delete" in run(cluster, "acls", "delete", "--yes", exit_code=2).output


def test_a_user_without_acls_on_the_cluster_is_refused_not_shown_an_empty_list(cluster: Cluster) -> None:
    # librdkafka answers a refused DescribeAcls with no ACLs and no error: the command asks the broker why.
    listed = run(cluster, "acls", "list", config=cluster.bob, exit_code=1)
    assert "CLUSTER_AUTHORIZATION_FAILED" in listed.output and "User:bob" in listed.output
    created = run(cluster, "acls", "create", "--allow", "User:bob", "--operation", "All", "--cluster",
                  config=cluster.bob, exit_code=1)
    assert "CLUSTER_AUTHORIZATION_FAILED" in created.output and "User:bob is not authorized to create ACLs" in \
        created.output
    assert run_json(cluster, "acls", "list", "--principal", "User:bob") == []


def test_the_acls_of_a_broker_without_an_authorizer_are_an_error_not_none(tmp_path: Path) -> None:
    with running_broker(tmp_path / "data") as broker:
        listed = CliRunner().invoke(cli, ["acls", "list", "--bootstrap", broker.bootstrap])
        assert listed.exit_code == 1 and "SECURITY_DISABLED" in listed.output, listed.output
        assert broker.stop() == 0, "".join(broker.output)


def test_quotas_are_set_described_and_deleted(cluster: Cluster) -> None:
    user = name("alice")
    run(cluster, "quotas", "alter", "--user", user, "--set", "producer_byte_rate=1048576",
        "--set", "consumer_byte_rate=2097152")
    assert run_json(cluster, "quotas", "describe", "--user", user) == [
        {"entity": {"user": user}, "quotas": {"consumer_byte_rate": 2097152, "producer_byte_rate": 1048576}}]
    run(cluster, "quotas", "alter", "--user", user, "--client-id", "etl", "--set", "request_rate=50.5")
    both = {"entity": {"user": user, "client-id": "etl"}, "quotas": {"request_rate": 50.5}}
    assert run_json(cluster, "quotas", "describe", "--user", user, "--client-id", "etl") == [both]
    assert [d["entity"] for d in run_json(cluster, "quotas", "describe", "--user", user)] == \
        [{"user": user}, {"user": user, "client-id": "etl"}], "a user's quotas include its client ids'"
    table = run(cluster, "quotas", "describe", "--user", user).stdout
    assert f"user={user}, client-id=etl" in table and "request_rate" in table and "50.5" in table

    run(cluster, "quotas", "alter", "--user", user, "--delete", "consumer_byte_rate")
    assert run_json(cluster, "quotas", "describe", "--user", user) == [
        {"entity": {"user": user}, "quotas": {"producer_byte_rate": 1048576}}, both]
    run(cluster, "quotas", "alter", "--user", user, "--delete", "producer_byte_rate")
    run(cluster, "quotas", "alter", "--user", user, "--client-id", "etl", "--delete", "request_rate")
    assert run_json(cluster, "quotas", "describe", "--user", user) == []
    assert "no quotas" in run(cluster, "quotas", "describe", "--user", user).stdout


def test_the_default_user_has_quotas_of_its_own(cluster: Cluster) -> None:
    run(cluster, "quotas", "alter", "--default-user", "--default-client-id", "--set", "consumer_byte_rate=10485760")
    default = {"entity": {"user": None, "client-id": None}, "quotas": {"consumer_byte_rate": 10485760}}
    try:
        assert run_json(cluster, "quotas", "describe", "--default-user") == [default]
        assert default in run_json(cluster, "quotas", "describe")
        assert "user=<default>, client-id=<default>" in run(cluster, "quotas", "describe", "--default-user").stdout
    finally:
        run(cluster, "quotas", "alter", "--default-user", "--default-client-id", "--delete", "consumer_byte_rate")
    assert run_json(cluster, "quotas", "describe", "--default-user") == []


def test_the_brokers_refusal_of_a_quota_is_the_commands_error(cluster: Cluster) -> None:
    user = name("erin")
    refused = run(cluster, "quotas", "alter", "--user", user, "--set", "producer_byte_rate=1024",
                  "--set", "bogus_rate=5", exit_code=1)
    assert "INVALID_REQUEST" in refused.output and "unknown quota 'bogus_rate'" in refused.output
    assert run_json(cluster, "quotas", "describe", "--user", user) == [], "nothing of a refused request is kept"
    assert "expected a number" in run(cluster, "quotas", "alter", "--user", user, "--set", "producer_byte_rate=fast",
                                      exit_code=2).output
    assert "whose quotas" in run(cluster, "quotas", "alter", "--set", "producer_byte_rate=1", exit_code=2).output
    # bob is no super user and has no ACL on the cluster.
    denied = run(cluster, "quotas", "describe", config=cluster.bob, exit_code=1)
    assert "CLUSTER_AUTHORIZATION_FAILED" in denied.output


@pytest.mark.parametrize("args", [("acls", "list"), ("quotas", "describe")], ids=["acls", "quotas"])
def test_a_wrong_password_is_a_clear_error(cluster: Cluster, args: tuple[str, ...]) -> None:
    result = run(cluster, *args, config=cluster.wrong, exit_code=1)
    assert "Authentication failed" in result.output, result.output


def test_a_refused_command_leaves_no_client_behind(cluster: Cluster) -> None:
    """librdkafka's client lives, retrying its login, as long as the object does: once a refused command
    is done with, its client must be freed at once, not left in a reference cycle until the collector runs."""
    from confluent_kafka.admin import AdminClient

    def clients() -> int:
        return sum(isinstance(o, AdminClient) for o in gc.get_objects())

    gc.collect()
    gc.disable()
    try:
        before = clients()
        for args in (("acls", "list"), ("quotas", "describe")):
            run(cluster, *args, config=cluster.wrong, exit_code=1)
        assert clients() == before
    finally:
        gc.enable()
