"""`stratalog serve` with TLS, SASL (PLAIN, SCRAM-SHA-256/512) and ACLs, against the three Kafka clients.

One broker listens twice: PLAINTEXT and SASL_SSL, both on 127.0.0.1, ACLs on, ``admin`` a super user.
Each client library logs in with SCRAM over TLS; a principal without ACLs is refused produce, fetch and
group join; ACLs and users are managed through the Kafka admin API. A second broker asks TLS clients
for certificates and takes their subject as the principal.
"""

from __future__ import annotations

import gc
import itertools
import re
import socket
import ssl
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import confluent_kafka
import confluent_kafka.admin
import pytest
import trustme
from cryptography import x509

from brokerkit import BrokerProcess, running_broker
from kafkaclients import CALL_TIMEOUT_S, CLIENTS, Client, Outgoing, Secured, consume_until, make_client
from waiting import wait_until

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)
    import kafka
    import kafka.admin
    import kafka.errors

PASSWORDS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}
_names = itertools.count()


def fresh(prefix: str, client: Client) -> str:
    return f"{prefix}-{client.name}-{next(_names)}"


@dataclass(frozen=True)
class Pki:
    ca: str
    cert: str
    key: str
    client_cert: str
    client_key: str
    #: The client certificate's subject as a principal (RFC 4514, most specific part first).
    client_principal: str


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    server = ca.issue_cert("127.0.0.1", "localhost")
    server.cert_chain_pems[0].write_to_path(str(d / "broker.pem"))
    server.private_key_pem.write_to_path(str(d / "broker.key"))
    client = ca.issue_cert("client.test", common_name="etl-job", organization_name="stratalog, tests")
    client.cert_chain_pems[0].write_to_path(str(d / "client.pem"))
    client.private_key_pem.write_to_path(str(d / "client.key"))
    subject = x509.load_pem_x509_certificate(client.cert_chain_pems[0].bytes()).subject.rfc4514_string()
    return Pki(str(d / "ca.pem"), str(d / "broker.pem"), str(d / "broker.key"), str(d / "client.pem"),
               str(d / "client.key"), "User:" + subject)


def add_user(data_dir: Path, name: str, password: str) -> None:
    subprocess.run([sys.executable, "-c", "from stratalog.cli import main; main()", "users", "add", name,
                    "--password-stdin", "--data-dir", str(data_dir)], input=password + "\n", text=True,
                   check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[BrokerProcess]:
    data = tmp_path_factory.mktemp("secure") / "data"
    for name, password in PASSWORDS.items():
        add_user(data, name, password)
    config = data.parent / "broker.toml"
    config.write_text("[groups]\ngroup_initial_rebalance_delay_ms = 0\n")
    with running_broker(data, "--config", str(config), "--listen", "SASL_SSL://127.0.0.1:0",
                        "--tls-cert", pki.cert, "--tls-key", pki.key, "--acls", "--super-user", "User:admin"
                        ) as process:
        yield process
        assert process.stop() == 0, "".join(process.output)


def login(broker: BrokerProcess, pki: Pki, user: str, mechanism: str = "SCRAM-SHA-256",
          password: str | None = None) -> Secured:
    return Secured(broker.listeners()["SASL_SSL"], "SASL_SSL", mechanism, user,
                   PASSWORDS[user] if password is None else password, cafile=pki.ca)


@pytest.fixture(scope="module", params=CLIENTS)
def client(request: pytest.FixtureRequest) -> Iterator[Client]:
    made = make_client(request.param)
    yield made
    made.close()


def admin_acls(target: Secured) -> kafka.admin.KafkaAdminClient:
    from kafkaclients import _kafka_python

    return kafka.admin.KafkaAdminClient(**_kafka_python(target))


def allow(admin: kafka.admin.KafkaAdminClient, principal: str, resource_type: Any, name: str,
          *operations: Any) -> None:
    acls = [kafka.admin.ACL(principal, "*", op, kafka.admin.ACLPermissionType.ALLOW,
                            kafka.admin.ResourcePattern(resource_type, name)) for op in operations]
    result = admin.create_acls(acls)
    assert not result["failed"], result


def refused(call: Callable[[], Any], timeout_s: float = CALL_TIMEOUT_S) -> str:
    """Run ``call`` until it raises (a consumer may poll a few times before its error surfaces); the error.
    A refused kafka-python client now and then drops a TLS socket unclosed: it is collected after each
    try, where its ResourceWarning is the client's and expected, not at a later moment of the test."""
    def error() -> str | None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            try:
                call()
            except Exception as e:  # each library raises its own type; the message is what is compared
                return f"{type(e).__name__}: {e}"
            finally:
                gc.collect()
        return None

    return wait_until(error, "the call to be refused", timeout_s)


def test_each_client_logs_in_with_scram_over_tls_and_a_super_user_may_do_everything(
        broker: BrokerProcess, pki: Pki, client: Client) -> None:
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        target = login(broker, pki, "admin", mechanism)
        topic = fresh("super", client)
        client.create_topic(target, topic, 2)
        producer = client.producer(target, idempotent=True)
        try:
            acked = producer.send_all([Outgoing(i % 2, b"k", b"v%d" % i) for i in range(6)], topic)
        finally:
            producer.close()
        assert sorted(acked) == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2)]
        consumer = client.consumer(target, fresh("super", client), [topic])
        try:
            [got] = consume_until([consumer], 6)
            consumer.commit()
        finally:
            consumer.close()
        assert sorted(r.value for r in got) == sorted(b"v%d" % i for i in range(6))


def test_a_principal_without_acls_is_refused_produce_fetch_and_group_join(
        broker: BrokerProcess, pki: Pki, client: Client) -> None:
    admin = login(broker, pki, "admin")
    bob = login(broker, pki, "bob")
    topic, group = fresh("guarded", client), fresh("guarded", client)
    client.create_topic(admin, topic, 1)
    producer = client.producer(admin)
    try:
        producer.send_all([Outgoing(0, None, b"secret")], topic)
    finally:
        producer.close()

    def produce() -> None:
        p = client.producer(bob)
        try:
            p.send_all([Outgoing(0, None, b"intruder")], topic)
        finally:
            p.close()

    assert "authoriz" in refused(produce).lower()

    def consume(group_id: str) -> Callable[[], None]:
        def run() -> None:
            c = client.consumer(bob, group_id, [topic])
            try:
                got = consume_until([c], 1, timeout_s=10)
                raise AssertionError(f"bob read {got}") from None
            finally:
                c.close()
        return run

    # Some libraries raise the broker's authorization error, others log it and deliver nothing (the exact
    # error codes are asserted on the wire in test_broker_acl_errors.py): either way, nothing is read.
    with admin_acls(admin) as acl_admin:
        # The group alone: the topic's records stay out of reach (fetch and metadata refused).
        allow(acl_admin, "User:bob", kafka.admin.ResourceType.GROUP, group, kafka.admin.ACLOperation.READ)
        assert any(w in refused(consume(group)).lower() for w in ("authoriz", "got 0 of 1"))
        # The topic alone: joining a group it has no ACL for is refused.
        allow(acl_admin, "User:bob", kafka.admin.ResourceType.TOPIC, topic, kafka.admin.ACLOperation.READ)
        assert any(w in refused(consume(fresh("other", client))).lower() for w in ("authoriz", "got 0 of 1"))
    # Both: bob reads the record.
    c = client.consumer(bob, group, [topic])
    try:
        [got] = consume_until([c], 1)
    finally:
        c.close()
    assert [r.value for r in got] == [b"secret"]


def test_prefixed_acls_give_a_principal_its_own_topics_only(broker: BrokerProcess, pki: Pki, client: Client) -> None:
    admin, alice = login(broker, pki, "admin"), login(broker, pki, "alice")
    prefix = fresh("alice-team", client)
    with admin_acls(admin) as acl_admin:
        acl_admin.create_acls([kafka.admin.ACL(
            "User:alice", "*", op, kafka.admin.ACLPermissionType.ALLOW,
            kafka.admin.ResourcePattern(kafka.admin.ResourceType.TOPIC, prefix,
                                        kafka.admin.ACLResourcePatternType.PREFIXED))
            for op in (kafka.admin.ACLOperation.CREATE, kafka.admin.ACLOperation.WRITE)])
    mine = prefix + ".events"
    client.create_topic(alice, mine, 1)
    producer = client.producer(alice)
    try:
        assert producer.send_all([Outgoing(0, None, b"ok")], mine) == [(0, 0)]
    finally:
        producer.close()
    assert "authoriz" in refused(lambda: client.create_topic(alice, fresh("elsewhere", client), 1)).lower()


def login_error(target: Secured) -> str:
    """What librdkafka reports for a login (its error callback: it retries a failed login for good); an
    AssertionError if none came within CALL_TIMEOUT_S. kafka-python retries silently until its own timeouts
    and aiokafka says only that it could not bootstrap (and leaves the refused socket to the garbage
    collector), so the refusals are asserted through librdkafka, which reports the broker's error at once."""
    from kafkaclients import _common

    errors: list[Any] = []
    producer = confluent_kafka.Producer({**_common(target), "error_cb": errors.append})

    def reported() -> str | None:
        if not errors:
            producer.poll(0.1)  # blocks up to 0.1 s for a callback: no pause needed between polls
        return str(errors[0]) if errors else None

    try:
        return wait_until(reported, "librdkafka to report the login's error", CALL_TIMEOUT_S, poll_s=0)
    finally:
        producer.close()   # else it retries the login for as long as it lives, past the broker's end


def test_a_wrong_password_or_unknown_user_is_refused_alike_and_logged(broker: BrokerProcess, pki: Pki) -> None:
    before = len(broker.output)
    wrong = login_error(login(broker, pki, "alice", password="not-it"))
    unknown = login_error(replace(login(broker, pki, "alice"), user="mallory"))
    # The same answer for both: nothing says which part was wrong.
    assert "Authentication failed: invalid username or password" in wrong
    def said(error: str) -> str:  # librdkafka adds how long it took
        return re.sub(r"\(after \d+ms.*", "", error)

    assert said(wrong) == said(unknown)

    def logged() -> bool:  # read from the broker's output by another thread: it may come after the answer
        said = "".join(broker.output[before:])
        return "authentication failed" in said and "'alice'" in said and "'mallory'" in said

    wait_until(logged, lambda: "both failed logins to be logged; the broker said:\n" + "".join(broker.output[before:]))


def test_plain_logs_in_against_the_same_credentials(broker: BrokerProcess, pki: Pki) -> None:
    client = make_client("kafka-python")
    target = login(broker, pki, "admin", "PLAIN")
    topic = fresh("plain", client)
    client.create_topic(target, topic, 1)
    assert topic in client.list_topics(target)
    assert "invalid username or password" in login_error(login(broker, pki, "admin", "PLAIN", password="wrong"))


def test_acls_are_created_described_and_deleted_through_librdkafka(broker: BrokerProcess, pki: Pki) -> None:
    from kafkaclients import _common

    admin = confluent_kafka.admin.AdminClient(_common(login(broker, pki, "admin")))
    admin_module = confluent_kafka.admin
    binding = admin_module.AclBinding(
        admin_module.ResourceType.GROUP, "librdkafka-acl-group", admin_module.ResourcePatternType.LITERAL,
        "User:bob", "*", admin_module.AclOperation.READ, admin_module.AclPermissionType.ALLOW)
    for future in admin.create_acls([binding], request_timeout=CALL_TIMEOUT_S).values():
        assert future.result(CALL_TIMEOUT_S) is None
    match = admin_module.AclBindingFilter(
        admin_module.ResourceType.GROUP, "librdkafka-acl-group", admin_module.ResourcePatternType.ANY,
        None, None, admin_module.AclOperation.ANY, admin_module.AclPermissionType.ANY)
    assert admin.describe_acls(match, request_timeout=CALL_TIMEOUT_S).result(CALL_TIMEOUT_S) == [binding]
    [deleted] = admin.delete_acls([match], request_timeout=CALL_TIMEOUT_S).values()
    assert deleted.result(CALL_TIMEOUT_S) == [binding]
    assert admin.describe_acls(match, request_timeout=CALL_TIMEOUT_S).result(CALL_TIMEOUT_S) == []

    # bob may not manage ACLs. (librdkafka drops DescribeAcls' error code and returns an empty list, so
    # the refusal is asserted on CreateAcls, whose per-ACL errors it reports.)
    bob = confluent_kafka.admin.AdminClient(_common(login(broker, pki, "bob")))
    [future] = bob.create_acls([binding], request_timeout=CALL_TIMEOUT_S).values()
    with pytest.raises(confluent_kafka.KafkaException, match=r"(?i)authoriz"):
        future.result(CALL_TIMEOUT_S)
    assert admin.describe_acls(match, request_timeout=CALL_TIMEOUT_S).result(CALL_TIMEOUT_S) == []


def test_users_are_managed_through_the_admin_api(broker: BrokerProcess, pki: Pki) -> None:
    from kafkaclients import _common

    admin_module = confluent_kafka.admin
    admin = admin_module.AdminClient(_common(login(broker, pki, "admin")))
    info = admin_module.ScramCredentialInfo(admin_module.ScramMechanism.SCRAM_SHA_512, 4096)
    futures = admin.alter_user_scram_credentials(
        [admin_module.UserScramCredentialUpsertion("dave", info, b"dave-secret")], request_timeout=CALL_TIMEOUT_S)
    assert futures["dave"].result(CALL_TIMEOUT_S) is None
    described = admin.describe_user_scram_credentials(["dave"], request_timeout=CALL_TIMEOUT_S)
    [(mechanism, iterations)] = [(i.mechanism, i.iterations)
                                 for i in described["dave"].result(CALL_TIMEOUT_S).scram_credential_infos]
    assert (mechanism, iterations) == (admin_module.ScramMechanism.SCRAM_SHA_512, 4096)

    dave = Secured(broker.listeners()["SASL_SSL"], "SASL_SSL", "SCRAM-SHA-512", "dave", "dave-secret", cafile=pki.ca)
    kp = make_client("kafka-python")
    kp.list_topics(dave)  # logs in; sees no topic it has no ACL for
    futures = admin.alter_user_scram_credentials(
        [admin_module.UserScramCredentialDeletion("dave", admin_module.ScramMechanism.SCRAM_SHA_512)],
        request_timeout=CALL_TIMEOUT_S)
    assert futures["dave"].result(CALL_TIMEOUT_S) is None
    assert "invalid username or password" in login_error(dave)


def test_a_client_certificate_names_the_principal(tmp_path: Path, pki: Pki) -> None:
    with running_broker(tmp_path / "data", "--listen", "SSL://127.0.0.1:0", "--tls-cert", pki.cert,
                        "--tls-key", pki.key, "--tls-ca", pki.ca, "--tls-client-auth", "required", "--acls",
                        "--super-user", pki.client_principal) as process:
        client = make_client("kafka-python")
        with_cert = Secured(process.listeners()["SSL"], "SSL", None, cafile=pki.ca, certfile=pki.client_cert,
                            keyfile=pki.client_key)
        topic = "certified"
        client.create_topic(with_cert, topic, 1)
        producer = client.producer(with_cert)
        try:
            assert producer.send_all([Outgoing(0, None, b"signed")], topic) == [(0, 0)]
        finally:
            producer.close()
        # Without a certificate the TLS handshake itself fails.
        host, _, port = process.listeners()["SSL"].rpartition(":")
        context = ssl.create_default_context(cafile=pki.ca)
        with socket.create_connection((host, int(port)), timeout=CALL_TIMEOUT_S) as raw:
            try:
                with context.wrap_socket(raw, server_hostname=host) as tls:
                    tls.sendall(b"\0\0\0\0")  # TLS 1.3 reports a refused certificate at the first read
                    answer = tls.recv(1)
            except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
                answer = b""
        assert answer == b"", "a client without a certificate got an answer"
        assert process.stop() == 0, "".join(process.output)


def spark_settings(pki: Pki, user: str, password: str | None = None) -> dict[str, str]:
    """The ``kafka.*`` settings of a Spark job logging in as ``user`` (librdkafka's names)."""
    return {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user,
            "sasl.password": PASSWORDS[user] if password is None else password, "ssl.ca.location": pki.ca}


def test_spark_writes_and_reads_over_sasl_ssl_with_the_writers_acls(broker: BrokerProcess, pki: Pki,
                                                                    spark: Any) -> None:
    from stratalog.engine import NewRecord
    from stratalog.engine.staging import STAGING_PREFIX
    from stratalog.kafka.client import BrokerConnectionError
    from stratalog.objects.local import LocalDirStore
    from stratalog.spark.broker_write import BrokerWriteError, commit_through_broker
    from stratalog.spark.write import StagingWriter

    address = broker.listeners()["SASL_SSL"]
    objects = LocalDirStore(broker.data_dir / "objects")

    def staged(n: int) -> list[tuple[int, Any]]:
        writer = StagingWriter(objects, f"{STAGING_PREFIX}secure-{n}/000000-")
        writer.add("spark-secure/0", [NewRecord(b"r%d" % i) for i in range(5)])
        return [(0, writer.finish())]

    with pytest.raises(BrokerConnectionError, match="refused the login"):
        commit_through_broker(address, spark_settings(pki, "admin", "wrong"), staged(1), None)
    with pytest.raises(BrokerWriteError, match="not authorized to write to topic 'spark-secure'"):
        commit_through_broker(address, spark_settings(pki, "bob"), staged(2), None)
    assert commit_through_broker(address, spark_settings(pki, "admin"), staged(3), None).records == 5

    reader = spark.read.format("stratalog").option("path", f"kafka://{address}").option("topics", "spark-secure")
    for name, value in spark_settings(pki, "admin").items():
        reader = reader.option(f"kafka.{name}", value)
    assert sorted(r.value for r in reader.load().collect()) == [b"r%d" % i for i in range(5)]


def test_tls_clients_that_close_cost_no_log_line_each(broker: BrokerProcess, pki: Pki) -> None:
    before = len(broker.output)
    host, _, port = broker.listeners()["SASL_SSL"].rpartition(":")
    context = ssl.create_default_context(cafile=pki.ca)
    for _ in range(20):
        with socket.create_connection((host, int(port)), timeout=CALL_TIMEOUT_S) as raw, \
                context.wrap_socket(raw, server_hostname=host) as tls:
            tls.unwrap().close()  # close_notify, answered by the broker's once it has handled the close
    # A failed login after them, logged: whatever the closes logged came first on the same pipe.
    login_error(replace(login(broker, pki, "alice"), user="after-the-closes"))
    wait_until(lambda: "'after-the-closes'" in "".join(broker.output[before:]), "the failed login to be logged")
    assert not [line for line in broker.output[before:] if "eof_received" in line]
