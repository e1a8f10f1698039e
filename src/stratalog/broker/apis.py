"""What an API the broker serves is: its key, its versions and its handler (``Api``), and the answer every
transactional request gets. The api_* modules define their handlers with it; api_registry.py gathers
them; the broker registers what that lists. Nothing here imports the broker: a handler gets it as an
argument."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stratalog.broker.session import Session
from stratalog.kafka.codec import Request

if TYPE_CHECKING:
    from stratalog.broker.broker import Broker

Handler = Callable[["Broker", Request, Session], Awaitable[Any]]
#: The message beside TRANSACTIONAL_ID_AUTHORIZATION_FAILED, the answer to a transactional request the
#: principal may not make: the error clients fail at once on (librdkafka, kafka-python and aiokafka).
TRANSACTIONS_REFUSED = "the principal may not use this transactional id (Kafka's ACLs: WRITE, DESCRIBE)"


@dataclass(frozen=True, slots=True)
class Api:
    """One API the broker serves: its versions and its handler. A handler returns the response as
    plain values (see ``stratalog.kafka.build``), a frame it encoded itself (``codec.Prebuilt``: Fetch),
    or None for a request that gets no response."""

    key: int
    name: str
    min_version: int
    max_version: int
    handler: Handler
    #: Its effect (a commit, a topic made, a record trimmed) lands after an await, in a worker thread or
    #: the database: the connection's later requests start only once it is answered, and it starts only
    #: once the connection's earlier such requests are. Kafka applies one connection's requests in order;
    #: without this, two pipelined commits could land in either order. Produce needs none: it appends in
    #: arrival order before its first await.
    ordered: bool = False
