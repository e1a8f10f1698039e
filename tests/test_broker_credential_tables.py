"""SCRAM credentials on SQLite and on PostgreSQL (a real server on 127.0.0.1, pgkit.py): the credential
store's cases of test_broker_sasl.py run again on both databases through this module's ``store`` fixture,
and a change made through one connection is seen by the next login through another, as `stratalog users`
changes it beside a running broker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from stratalog.broker.credentials import ITERATIONS_MIN, CredentialStore, ScramMechanism, make_credential
from stratalog.broker.sasl import AuthenticationFailedError, PlainExchange
from test_broker_sasl import (  # the credential store's cases, run on both databases
    test_an_unknown_user_gets_the_same_salt_each_time_so_tries_look_alike,  # noqa: F401
    test_credentials_keep_no_password_and_match_only_their_own,  # noqa: F401
    test_plain_logs_in_against_the_scram_credential,  # noqa: F401
    test_plain_refuses_every_bad_token_with_the_same_message,  # noqa: F401
    test_scram_logs_in_with_the_right_password,  # noqa: F401
    test_scram_names_with_commas_and_equals_are_unescaped,  # noqa: F401
    test_scram_refuses_a_wrong_password_and_an_unknown_user_at_the_same_step_alike,  # noqa: F401
    test_users_are_listed_and_removed,  # noqa: F401
)

pytest_plugins = ["pgkit"]


@pytest.fixture
def store(tables_at: Path | str) -> Iterator[CredentialStore]:
    made = CredentialStore(tables_at)
    for mechanism in ScramMechanism:
        made.put("alice", make_credential(mechanism, "wonderland", ITERATIONS_MIN))
    yield made
    made.close()


def test_a_password_changed_through_another_connection_is_the_one_the_next_login_checks(
        tables_at: Path | str, store: CredentialStore) -> None:
    admin = CredentialStore(tables_at)
    try:
        for mechanism in ScramMechanism:
            admin.put("alice", make_credential(mechanism, "looking-glass", ITERATIONS_MIN))
        admin.remove("alice", ScramMechanism.SCRAM_SHA_512)
    finally:
        admin.close()
    with pytest.raises(AuthenticationFailedError):
        PlainExchange(store).step(b"\0alice\0wonderland")
    exchange = PlainExchange(store)
    exchange.step(b"\0alice\0looking-glass")
    assert exchange.principal == "User:alice"
    assert store.users() == {"alice": [(ScramMechanism.SCRAM_SHA_256, ITERATIONS_MIN)]}
