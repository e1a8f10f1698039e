"""Who looks at the console, when the broker checks who its clients are.

A broker with ACLs on (``serve --acls``) or a SASL listener asks console users to log in with the same
users and passwords as its Kafka clients (``stratalog users``), and shows each only what that principal
may describe, as Kafka's APIs would. A login gives a session: a random token in an HttpOnly, SameSite
cookie, kept in memory (``SESSIONS_MAX`` at most, each ``SESSION_S`` long; a restart logs everyone out).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stratalog.broker.acls import Operation, ResourceType
from stratalog.broker.http_login import password_ok

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker

#: How long a session lasts after its login.
SESSION_S = 3600.0
#: Sessions kept at most: past it, the oldest is dropped (its user logs in again).
SESSIONS_MAX = 1000
#: The session cookie's name.
COOKIE = "stratalog_console"


@dataclass(frozen=True)
class Viewer:
    """Who looks: a principal (``User:alice``) from a host, or everyone when the broker checks no one."""

    principal: str | None
    host: str

    @property
    def anonymous(self) -> bool:
        return self.principal is None


class Access:
    """What ``viewer`` may see, decided by the broker's authorizer (on its loop, through ``on_loop``)."""

    def __init__(self, broker: Broker, on_loop: Callable[[Callable[[], Any]], Any]) -> None:
        self._broker = broker
        self._on_loop = on_loop

    def may(self, viewer: Viewer, operation: Operation, resource_type: ResourceType, name: str) -> bool:
        if viewer.principal is None:
            return True
        authorizer, principal = self._broker.authorizer, viewer.principal
        return bool(self._on_loop(lambda: authorizer.allowed(principal, viewer.host, operation, resource_type,
                                                             name)))

    def allowed(self, viewer: Viewer, operation: Operation, resource_type: ResourceType,
                names: list[str]) -> list[str]:
        """The names of ``names`` ``viewer`` may act on so, in one call on the loop."""
        if viewer.principal is None:
            return names
        authorizer, principal = self._broker.authorizer, viewer.principal
        return list(self._on_loop(lambda: [n for n in names if authorizer.allowed(principal, viewer.host, operation,
                                                                                   resource_type, n)]))

    def topic(self, viewer: Viewer, name: str, operation: Operation = Operation.DESCRIBE) -> bool:
        return self.may(viewer, operation, ResourceType.TOPIC, name)

    def group(self, viewer: Viewer, name: str) -> bool:
        return self.may(viewer, Operation.DESCRIBE, ResourceType.GROUP, name)

    def cluster(self, viewer: Viewer) -> bool:
        return self.may(viewer, Operation.DESCRIBE, ResourceType.CLUSTER, "kafka-cluster")


class Sessions:
    """Logged-in users by session token. Thread-safe: the console serves each request in a thread."""

    def __init__(self, broker: Broker, on_loop: Callable[[Callable[[], Any]], Any], *, always: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._broker = broker
        self._on_loop = on_loop
        #: A login even from a broker that checks no client: the console is served over HTTPS, to a network.
        self._always = always
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: dict[str, tuple[str, float]] = {}

    @property
    def required(self) -> bool:
        """Whether the broker checks who its clients are (ACLs on, or a SASL listener)."""
        config = self._broker.config
        return self._always or config.authorizer.enabled or any(listener.protocol.sasl
                                                                 for listener in config.listeners)

    def login(self, user: str, password: str) -> str | None:
        """A new session's token, or None for an unknown user or a wrong password (alike)."""
        if not password_ok(self._broker, self._on_loop, user, password):
            return None
        token = secrets.token_urlsafe(32)
        with self._lock:
            if len(self._sessions) >= SESSIONS_MAX:
                del self._sessions[min(self._sessions, key=lambda t: self._sessions[t][1])]
            self._sessions[token] = (f"User:{user}", self._clock() + SESSION_S)
        return token

    def principal(self, token: str | None) -> str | None:
        """The principal of a live session, or None."""
        if not token:
            return None
        with self._lock:
            found = self._sessions.get(token)
            if found is None:
                return None
            if found[1] < self._clock():
                del self._sessions[token]
                return None
            return found[0]

    def logout(self, token: str | None) -> None:
        with self._lock:
            self._sessions.pop(token or "", None)
