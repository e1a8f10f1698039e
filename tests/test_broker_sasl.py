"""SASL logins as token exchanges (PLAIN and SCRAM against scramp's client), the credential store, and
the listener rules, without a socket."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scramp import ScramClient

from stratalog.broker.credentials import (
    ITERATIONS_MIN,
    CredentialError,
    CredentialStore,
    ScramMechanism,
    credential_from_salted,
    make_credential,
    password_matches,
    salt_password,
)
from stratalog.broker.listeners import (
    ClientAuth,
    Listener,
    ListenerConfigError,
    SecurityProtocol,
    TLSConfig,
    certificate_principal,
    check_listeners,
)
from stratalog.broker.sasl import (
    FAILED_MESSAGE,
    TOKEN_BYTES_MAX,
    AuthenticationFailedError,
    PlainExchange,
    ScramExchange,
    new_secret,
)

SHA256, SHA512 = ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512


@pytest.fixture
def store(tmp_path: Path) -> Iterator[CredentialStore]:
    made = CredentialStore(tmp_path / "broker.sqlite")
    for mechanism in ScramMechanism:
        made.put("alice", make_credential(mechanism, "wonderland", ITERATIONS_MIN))
    yield made
    made.close()


def scram_login(store: CredentialStore, mechanism: ScramMechanism, user: str, password: str,
                secret: bytes = b"s" * 32) -> ScramExchange:
    exchange = ScramExchange(mechanism, store, secret)
    client = ScramClient([mechanism.sasl_name], user, password)
    server_first = exchange.step(client.get_client_first().encode())
    client.set_server_first(server_first.decode())
    server_final = exchange.step(client.get_client_final().encode())
    client.set_server_final(server_final.decode())  # the client checks the broker's signature too
    return exchange


@pytest.mark.parametrize("mechanism", list(ScramMechanism))
def test_scram_logs_in_with_the_right_password(store: CredentialStore, mechanism: ScramMechanism) -> None:
    assert scram_login(store, mechanism, "alice", "wonderland").principal == "User:alice"


@pytest.mark.parametrize("user", ["alice", "mallory"])
def test_scram_refuses_a_wrong_password_and_an_unknown_user_at_the_same_step_alike(
        store: CredentialStore, user: str) -> None:
    exchange = ScramExchange(SHA256, store, new_secret())
    client = ScramClient([SHA256.sasl_name], user, "guess")
    server_first = exchange.step(client.get_client_first().encode())  # the first round passes for both
    client.set_server_first(server_first.decode())
    with pytest.raises(AuthenticationFailedError) as failed:
        exchange.step(client.get_client_final().encode())
    assert str(failed.value) == FAILED_MESSAGE and exchange.principal is None


def test_an_unknown_user_gets_the_same_salt_each_time_so_tries_look_alike(store: CredentialStore) -> None:
    secret = new_secret()
    firsts = []
    for _ in range(2):
        exchange = ScramExchange(SHA256, store, secret)
        first = exchange.step(ScramClient([SHA256.sasl_name], "mallory", "x").get_client_first().encode()).decode()
        firsts.append({k: v for k, v in (part.split("=", 1) for part in first.split(","))})
    assert firsts[0]["s"] == firsts[1]["s"] and firsts[0]["i"] == firsts[1]["i"]


def test_scram_names_with_commas_and_equals_are_unescaped(store: CredentialStore) -> None:
    store.put("a,b=c", make_credential(SHA512, "pw", ITERATIONS_MIN))
    assert scram_login(store, SHA512, "a,b=c", "pw").principal == "User:a,b=c"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.binary(max_size=300))
def test_scram_refuses_garbage_with_the_one_failure_type(tmp_path_factory: pytest.TempPathFactory, first: bytes,
                                                          final: bytes) -> None:
    store = CredentialStore(tmp_path_factory.mktemp("garbage") / "broker.sqlite")
    try:
        exchange = ScramExchange(SHA256, store, b"s" * 32)
        with pytest.raises(AuthenticationFailedError):
            exchange.step(first)
            exchange.step(final)
        assert exchange.principal is None
    finally:
        store.close()


def test_plain_logs_in_against_the_scram_credential(store: CredentialStore) -> None:
    exchange = PlainExchange(store)
    assert exchange.step(b"\0alice\0wonderland") == b"" and exchange.principal == "User:alice"


@pytest.mark.parametrize("token", [b"\0alice\0wrong", b"\0mallory\0wonderland", b"\0alice\0", b"alice\0wonderland",
                                   b"bob\0alice\0wonderland", b"\0\xff\0x", b"\0alice\0wonderland\0extra",
                                   b"\0alice\0" + b"w" * TOKEN_BYTES_MAX])
def test_plain_refuses_every_bad_token_with_the_same_message(store: CredentialStore, token: bytes) -> None:
    exchange = PlainExchange(store)
    with pytest.raises(AuthenticationFailedError) as failed:
        exchange.step(token)
    assert str(failed.value) == FAILED_MESSAGE and exchange.principal is None


def test_plain_takes_one_token_only(store: CredentialStore) -> None:
    exchange = PlainExchange(store)
    exchange.step(b"\0alice\0wonderland")
    with pytest.raises(AuthenticationFailedError):
        exchange.step(b"\0alice\0wonderland")


def test_credentials_keep_no_password_and_match_only_their_own(store: CredentialStore) -> None:
    credential = store.get("alice", SHA256)
    assert credential is not None
    assert b"wonderland" not in credential.salt + credential.stored_key + credential.server_key
    assert password_matches(credential, "wonderland") and not password_matches(credential, "wonderland!")
    again = make_credential(SHA256, "wonderland", ITERATIONS_MIN)
    assert again.salt != credential.salt and again.stored_key != credential.stored_key


def test_a_salted_password_sent_by_an_admin_client_stores_the_same_keys() -> None:
    made = make_credential(SHA512, "pw", 5000)
    sent = credential_from_salted(SHA512, made.salt, 5000, salt_password(SHA512, "pw", made.salt, 5000))
    assert sent == made


@pytest.mark.parametrize("iterations", [ITERATIONS_MIN - 1, 16385])
def test_iterations_out_of_bounds_are_refused(iterations: int) -> None:
    with pytest.raises(CredentialError, match="iterations"):
        make_credential(SHA256, "pw", iterations)


def test_users_are_listed_and_removed(store: CredentialStore) -> None:
    assert store.users() == {"alice": [(SHA256, ITERATIONS_MIN), (SHA512, ITERATIONS_MIN)]}
    assert store.remove("alice", SHA512) == 1
    assert store.users() == {"alice": [(SHA256, ITERATIONS_MIN)]}
    assert store.remove("alice") == 1 and store.users() == {} and store.remove("alice") == 0


# Listeners ------------------------------------------------------------------------------------------------

def test_listeners_parse_as_kafka_writes_them() -> None:
    assert Listener.parse("SASL_SSL://0.0.0.0:9093") == Listener(SecurityProtocol.SASL_SSL, "0.0.0.0", 9093)
    assert Listener.parse("127.0.0.1:9092") == Listener(SecurityProtocol.PLAINTEXT, "127.0.0.1", 9092)
    assert Listener.parse("ssl://[::1]:9094") == Listener(SecurityProtocol.SSL, "::1", 9094)
    for bad in ("HTTP://x:1", "SSL://x", "x:99999", ":9092"):
        with pytest.raises(ListenerConfigError):
            Listener.parse(bad)


def test_only_authenticating_listeners_may_leave_loopback() -> None:
    tls = TLSConfig(certfile="cert.pem")
    for text in ("SASL_SSL://0.0.0.0:9093", "SASL_PLAINTEXT://10.1.2.3:9093", "127.0.0.1:9092", "localhost:1"):
        check_listeners((Listener.parse(text),), tls, allow_plaintext_anywhere=False)
    for text in ("0.0.0.0:9092", "SSL://0.0.0.0:9093"):
        with pytest.raises(ListenerConfigError, match="does not authenticate"):
            check_listeners((Listener.parse(text),), tls, allow_plaintext_anywhere=False)
        check_listeners((Listener.parse(text),), tls, allow_plaintext_anywhere=True)
    required = TLSConfig(certfile="cert.pem", cafile="ca.pem", client_auth=ClientAuth.REQUIRED)
    check_listeners((Listener.parse("SSL://0.0.0.0:9093"),), required, allow_plaintext_anywhere=False)


def test_tls_listeners_need_a_certificate_and_client_auth_needs_a_ca() -> None:
    with pytest.raises(ListenerConfigError, match="--tls-cert"):
        check_listeners((Listener.parse("SSL://127.0.0.1:9093"),), TLSConfig(), False)
    with pytest.raises(ListenerConfigError, match="--tls-ca"):
        check_listeners((Listener.parse("SSL://127.0.0.1:9093"),),
                        TLSConfig(certfile="c", client_auth=ClientAuth.REQUIRED), False)
    with pytest.raises(ListenerConfigError, match="two listeners"):
        check_listeners((Listener.parse("127.0.0.1:9092"), Listener.parse("SASL_PLAINTEXT://127.0.0.1:9092")),
                        TLSConfig(), False)


def test_a_certificate_subject_becomes_a_principal_most_specific_first() -> None:
    subject = ((("countryName", "NL"),), (("organizationName", "Acme, Inc"),), (("commonName", "#etl "),))
    assert certificate_principal({"subject": subject}) == "User:CN=\\#etl\\ ,O=Acme\\, Inc,C=NL"
    assert certificate_principal(None) is None and certificate_principal({}) is None
