"""Who asks, on the broker's HTTPS services: a user of the broker (``stratalog users``) by its password,
over HTTP Basic for ``/metrics`` (what Prometheus's ``basic_auth`` sends), and the console's login form.

Credentials and ACLs are the broker's, read on its event loop through ``on_loop``; the password is checked
(PBKDF2) in the caller's thread, not on the loop.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stratalog.broker.acls import Operation, ResourceType
from stratalog.broker.credentials import password_matches

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker

OnLoop = Callable[[Callable[[], Any]], Any]
#: The longest user name or password taken.
FIELD_CHARS_MAX = 256
#: The longest Authorization header read.
HEADER_CHARS_MAX = 1024
HTTP_UNAUTHORIZED, HTTP_FORBIDDEN = 401, 403
#: Kafka's one name of the cluster resource.
CLUSTER = "kafka-cluster"


def password_ok(broker: Broker, on_loop: OnLoop, user: str, password: str) -> bool:
    """Whether ``password`` is ``user``'s (an unknown user and a wrong password answer alike)."""
    if not user or not password or len(user) > FIELD_CHARS_MAX or len(password) > FIELD_CHARS_MAX:
        return False
    credentials = broker.credentials
    credential = on_loop(lambda: credentials.any_of(user))
    return credential is not None and password_matches(credential, password)


class BasicLogin:
    """HTTP Basic for ``/metrics``: a user whose ACLs let it describe the cluster (a super user, or an ACL
    such as ``stratalog acls create --allow User:prometheus --operation Describe --cluster``)."""

    def __init__(self, broker: Broker, on_loop: OnLoop) -> None:
        self._broker = broker
        self._on_loop = on_loop

    def refusal(self, header: str | None, host: str) -> tuple[int, str] | None:
        """None when the request may go on; else the status and the reason to answer with."""
        user, password = _basic(header)
        if user is None or password is None or not password_ok(self._broker, self._on_loop, user, password):
            return HTTP_UNAUTHORIZED, "log in with a user of the broker and its password (HTTP Basic)"
        authorizer, principal = self._broker.authorizer, f"User:{user}"
        if not self._on_loop(lambda: authorizer.allowed(principal, host, Operation.DESCRIBE, ResourceType.CLUSTER,
                                                        CLUSTER)):
            return HTTP_FORBIDDEN, f"{principal} may not describe the cluster"
        return None


def _basic(header: str | None) -> tuple[str | None, str | None]:
    if not header or len(header) > HEADER_CHARS_MAX or not header.startswith("Basic "):
        return None, None
    try:
        decoded = base64.b64decode(header[len("Basic "):], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None, None
    user, sep, password = decoded.partition(":")
    return (user, password) if sep else (None, None)
