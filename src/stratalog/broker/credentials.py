"""Users' SCRAM credentials, salted and hashed, durable in the broker's metadata (``broker.sqlite``, or
PostgreSQL: metadata_db.py).

What is kept of a password is what SCRAM (RFC 5802, RFC 7677) needs and no more: a random salt, the
iteration count, StoredKey = H(HMAC(SaltedPassword, "Client Key")) and ServerKey = HMAC(SaltedPassword,
"Server Key"), per mechanism (SCRAM-SHA-256, SCRAM-SHA-512). The password cannot be read back from
them. SASL PLAIN logins are checked against the same credentials: the password given is salted and
hashed the same way and its StoredKey compared in constant time, so one ``stratalog users add``
serves both mechanisms.

The table is read on every login (not cached): ``stratalog users`` may change it while the broker runs,
and a removed user can no longer log in from the next connection on.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import os
import threading
from dataclasses import dataclass

from stratalog.broker.metadata_db import Location, open_metadata
from stratalog.errors import StratalogError

# "user" in quotes: PostgreSQL reserves the word (unquoted it is the session's user); SQLite names the
# column the same either way.
SCHEMA = """
CREATE TABLE IF NOT EXISTS scram_credentials (
    "user" TEXT NOT NULL,
    mechanism TEXT NOT NULL,
    salt BLOB NOT NULL,
    iterations INTEGER NOT NULL,
    stored_key BLOB NOT NULL,
    server_key BLOB NOT NULL,
    PRIMARY KEY ("user", mechanism)
);
"""
#: Kafka's bounds on SCRAM iterations: 4096 is RFC 7677's minimum recommendation; 16384 caps the work a
#: login costs the broker.
ITERATIONS_MIN = 4096
ITERATIONS_MAX = 16384
DEFAULT_ITERATIONS = 8192
#: Bytes of random salt per credential.
SALT_BYTES = 32
#: The longest user name accepted (Kafka bounds none; a name is a row key and part of log lines).
USER_NAME_CHARS_MAX = 256


class ScramMechanism(enum.Enum):
    """SCRAM mechanisms, with their numbers in the admin APIs (DescribeUserScramCredentials)."""

    SCRAM_SHA_256 = ("SCRAM-SHA-256", 1, "sha256")
    SCRAM_SHA_512 = ("SCRAM-SHA-512", 2, "sha512")

    def __init__(self, sasl_name: str, number: int, hash_name: str) -> None:
        self.sasl_name = sasl_name
        self.number = number
        self.hash_name = hash_name

    @classmethod
    def named(cls, name: str) -> ScramMechanism:
        for m in cls:
            if m.sasl_name == name.upper():
                return m
        raise ValueError(f"unknown SCRAM mechanism {name!r}; use SCRAM-SHA-256 or SCRAM-SHA-512")

    @classmethod
    def numbered(cls, number: int) -> ScramMechanism | None:
        return next((m for m in cls if m.number == number), None)


class CredentialError(StratalogError, ValueError):
    """A user name, password or iteration count the store refuses."""


@dataclass(frozen=True, slots=True)
class ScramCredential:
    mechanism: ScramMechanism
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


#: Characters below this are ASCII control characters, which a user name may not hold.
CONTROL_CHARS_END = 0x20


def check_user_name(user: str) -> str:
    if not user or len(user) > USER_NAME_CHARS_MAX or any(ord(c) < CONTROL_CHARS_END for c in user):
        raise CredentialError(f"a user name is 1 to {USER_NAME_CHARS_MAX} printable characters")
    return user


def credential_from_salted(mechanism: ScramMechanism, salt: bytes, iterations: int,
                           salted_password: bytes) -> ScramCredential:
    """The stored form of a salted password (what AlterUserScramCredentials sends)."""
    if not ITERATIONS_MIN <= iterations <= ITERATIONS_MAX:
        raise CredentialError(f"iterations must be {ITERATIONS_MIN} to {ITERATIONS_MAX}, not {iterations}")
    if not salt:
        raise CredentialError("the salt must not be empty")
    h = mechanism.hash_name
    client_key = hmac.digest(salted_password, b"Client Key", h)
    stored_key = hashlib.new(h, client_key).digest()
    server_key = hmac.digest(salted_password, b"Server Key", h)
    return ScramCredential(mechanism, salt, iterations, stored_key, server_key)


def salt_password(mechanism: ScramMechanism, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(mechanism.hash_name, password.encode(), salt, iterations)


def make_credential(mechanism: ScramMechanism, password: str,
                    iterations: int = DEFAULT_ITERATIONS) -> ScramCredential:
    if not password:
        raise CredentialError("the password must not be empty")
    salt = os.urandom(SALT_BYTES)
    return credential_from_salted(mechanism, salt, iterations, salt_password(mechanism, password, salt, iterations))


def password_matches(credential: ScramCredential, password: str) -> bool:
    """Whether ``password`` is the one the credential was made from (SASL PLAIN), in constant time."""
    salted = salt_password(credential.mechanism, password, credential.salt, credential.iterations)
    candidate = credential_from_salted(credential.mechanism, credential.salt, credential.iterations, salted)
    return hmac.compare_digest(candidate.stored_key, credential.stored_key)


class CredentialStore:
    """The users' credentials. Thread-safe; a change is durable when the call returns.

    ``location``: ``broker.sqlite``'s path, or a PostgreSQL URI."""

    def __init__(self, location: Location) -> None:
        self._lock = threading.Lock()
        self._db = open_metadata(location, SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def put(self, user: str, credential: ScramCredential) -> None:
        check_user_name(user)
        with self._lock:
            self._db.execute("INSERT INTO scram_credentials VALUES (?, ?, ?, ?, ?, ?) "
                             'ON CONFLICT ("user", mechanism) DO UPDATE SET salt = excluded.salt, '
                             "iterations = excluded.iterations, stored_key = excluded.stored_key, "
                             "server_key = excluded.server_key",
                             (user, credential.mechanism.sasl_name, credential.salt, credential.iterations,
                              credential.stored_key, credential.server_key))

    def remove(self, user: str, mechanism: ScramMechanism | None = None) -> int:
        """Remove a user's credential of ``mechanism`` (None: all of them); returns how many went."""
        with self._lock:
            if mechanism is None:
                cursor = self._db.execute('DELETE FROM scram_credentials WHERE "user" = ?', (user,))
            else:
                cursor = self._db.execute('DELETE FROM scram_credentials WHERE "user" = ? AND mechanism = ?',
                                          (user, mechanism.sasl_name))
            return cursor.rowcount

    def get(self, user: str, mechanism: ScramMechanism) -> ScramCredential | None:
        with self._lock:
            row = self._db.execute("SELECT salt, iterations, stored_key, server_key FROM scram_credentials "
                                   'WHERE "user" = ? AND mechanism = ?', (user, mechanism.sasl_name)).fetchone()
        return None if row is None else ScramCredential(mechanism, bytes(row[0]), row[1], bytes(row[2]),
                                                        bytes(row[3]))

    def any_of(self, user: str) -> ScramCredential | None:
        """One credential of the user, whichever mechanism (for PLAIN)."""
        for mechanism in ScramMechanism:
            credential = self.get(user, mechanism)
            if credential is not None:
                return credential
        return None

    def users(self) -> dict[str, list[tuple[ScramMechanism, int]]]:
        """Every user, with the mechanisms and iteration counts of their credentials."""
        with self._lock:
            rows = self._db.execute('SELECT "user", mechanism, iterations FROM scram_credentials').fetchall()
        out: dict[str, list[tuple[ScramMechanism, int]]] = {}
        # Sorted here, by code point: a PostgreSQL database's collation may order text otherwise.
        for user, mechanism, iterations in sorted(rows):
            out.setdefault(user, []).append((ScramMechanism.named(mechanism), iterations))
        return out
