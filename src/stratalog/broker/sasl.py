"""SASL authentication as exchanges of tokens: bytes in, bytes out, no sockets (SaslAuthenticate carries
the tokens; ``api_security`` is the shell).

PLAIN (RFC 4616): one token, ``authzid NUL user NUL password``, checked against the user's SCRAM
credential. SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677): two rounds, the proof checked with
the stored keys; the exchange itself is ``scramp``'s. A user that does not exist goes through the same
rounds as one that does, with a credential derived from the name and a per-broker secret, and fails
at the same step with the same message: a failure never says which part was wrong.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from typing import Protocol

from stratalog.broker.credentials import (
    DEFAULT_ITERATIONS,
    CredentialStore,
    ScramCredential,
    ScramMechanism,
    password_matches,
)
from stratalog.errors import StratalogError

PLAIN = "PLAIN"
#: The mechanisms a SASL listener offers, in SaslHandshake's answer.
MECHANISMS = (PLAIN, *(m.sasl_name for m in ScramMechanism))
#: The one message a failed login gets, whatever failed (Kafka's wording).
FAILED_MESSAGE = "Authentication failed: invalid username or password"
#: The longest PLAIN or SCRAM token read (a name and a password, or a SCRAM message, are far smaller).
TOKEN_BYTES_MAX = 4096
#: A PLAIN token: authzid, user and password, separated by NUL bytes (RFC 4616).
PLAIN_TOKEN_PARTS = 3
#: SCRAM's second client message (client-final, RFC 5802) arrives in this round of a login.
SCRAM_CLIENT_FINAL_ROUND = 2


class AuthenticationFailedError(StratalogError):
    """A login that failed. ``reason`` goes to the broker's log only; the client gets FAILED_MESSAGE."""

    def __init__(self, reason: str) -> None:
        super().__init__(FAILED_MESSAGE)
        self.reason = reason


class SaslExchange(Protocol):
    """One login: ``step`` takes the client's token and returns the broker's; once ``principal`` is set
    the client is authenticated. Steps may read the credential store and hash: call them off the loop."""

    mechanism: str
    principal: str | None
    #: The user name the client gave, once known (for log lines).
    user: str | None

    def step(self, token: bytes) -> bytes: ...


def start_exchange(mechanism: str, credentials: CredentialStore, secret: bytes) -> SaslExchange:
    """An exchange for a mechanism in MECHANISMS (SaslHandshake checked the name)."""
    if mechanism == PLAIN:
        return PlainExchange(credentials)
    return ScramExchange(ScramMechanism.named(mechanism), credentials, secret)


def new_secret() -> bytes:
    """A per-broker secret for the stand-in credentials of unknown users."""
    return os.urandom(32)


class PlainExchange:
    def __init__(self, credentials: CredentialStore) -> None:
        self.mechanism = PLAIN
        self.principal: str | None = None
        self.user: str | None = None
        self._credentials = credentials

    def step(self, token: bytes) -> bytes:
        if self.principal is not None:
            raise AuthenticationFailedError("PLAIN takes one token; a second one came")
        if len(token) > TOKEN_BYTES_MAX:
            raise AuthenticationFailedError(f"PLAIN token of {len(token)} bytes")
        parts = token.split(b"\0")
        if len(parts) != PLAIN_TOKEN_PARTS:
            raise AuthenticationFailedError("a PLAIN token is authzid NUL user NUL password")
        try:
            authzid, user, password = (p.decode() for p in parts)
        except UnicodeDecodeError:
            raise AuthenticationFailedError("a PLAIN token that is not UTF-8") from None
        self.user = user
        if authzid and authzid != user:
            raise AuthenticationFailedError(f"user {user!r} asked to act as {authzid!r}")
        credential = self._credentials.any_of(user)
        if credential is None or not password or not password_matches(credential, password):
            raise AuthenticationFailedError(f"user {user!r}: unknown user or wrong password")
        self.principal = f"User:{user}"
        return b""


class ScramExchange:
    def __init__(self, mechanism: ScramMechanism, credentials: CredentialStore, secret: bytes) -> None:
        self.mechanism = mechanism.sasl_name
        self.principal: str | None = None
        self.user: str | None = None
        self._scram = mechanism
        self._credentials = credentials
        self._secret = secret
        self._known = False
        from scramp import ScramMechanism as ScrampMechanism  # here: a broker without SCRAM logins never loads it

        self._server = ScrampMechanism(mechanism.sasl_name).make_server(self._auth_info)
        self._round = 0

    def _auth_info(self, sasl_name: str) -> tuple[bytes, bytes, bytes, int]:
        # RFC 5802 escapes ',' and '=' in user names as =2C and =3D.
        user = sasl_name.replace("=2C", ",").replace("=3D", "=")
        self.user = user
        credential = self._credentials.get(user, self._scram)
        self._known = credential is not None
        if credential is None:
            credential = self._stand_in(user)
        return credential.salt, credential.stored_key, credential.server_key, credential.iterations

    def _stand_in(self, user: str) -> ScramCredential:
        """A credential no password matches, the same for the same name (so repeated tries look alike)."""
        h = self._scram.hash_name
        digest = hmac.digest(self._secret, user.encode(), h)
        return ScramCredential(self._scram, digest[:32], DEFAULT_ITERATIONS, hashlib.new(h, digest).digest(),
                               hmac.digest(digest, b"Server Key", h))

    def step(self, token: bytes) -> bytes:
        if len(token) > TOKEN_BYTES_MAX:
            raise AuthenticationFailedError(f"SCRAM message of {len(token)} bytes")
        self._round += 1
        try:
            message = token.decode()
            if self._round == 1:
                self._server.set_client_first(message)
                return str(self._server.get_server_first()).encode()
            if self._round == SCRAM_CLIENT_FINAL_ROUND:
                self._server.set_client_final(message)
                final = str(self._server.get_server_final()).encode()
            else:
                raise AuthenticationFailedError("SCRAM is two rounds; a third token came")
        except AuthenticationFailedError:
            raise
        except Exception as e:  # scramp parses what the peer sent: anything it raises is a failed login
            raise AuthenticationFailedError(f"user {self.user!r}: {type(e).__name__}: {e}") from None
        if not self._known:
            raise AuthenticationFailedError(f"user {self.user!r}: unknown user")
        self.principal = f"User:{self.user}"
        return final
