"""Client quotas: produce and fetch byte rates and request rates per user, client id, or both.

As in Kafka, a quota is set for an entity (a user, a client id, a user with a client id, or the default
of either, written with the name None) and the most specific one that matches a request applies, in
Kafka's order (user+client, user+default client, user, default user+client, default user+default
client, default user, client, default client), then the broker's ``[quotas]`` defaults. Each user or
client id a quota applies to has its own rate, measured over ``windows`` windows of ``window_s``.

A request that takes the rate over its quota is served, and its response says how long to wait
(throttle_time_ms): ``(rate - quota) / quota x the measured span``, at most ``throttle_ms_max``. The
broker also stops reading that connection for as long (Kafka's channel muting), so a client that ignores
the hint is slowed all the same.

Keys: ``producer_byte_rate`` and ``consumer_byte_rate`` (bytes/s of produce requests and fetch
responses, Kafka's names) and ``request_rate`` (requests/s of any kind: this broker measures requests,
not Kafka's share of thread time, request_percentage, which it refuses).
"""

from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from stratalog.broker.metadata_db import Location, open_metadata
from stratalog.engine.metadata_backends import Backend, writing
from stratalog.errors import StratalogError

SCHEMA = """
CREATE TABLE IF NOT EXISTS client_quotas (
    entity TEXT NOT NULL,
    key TEXT NOT NULL,
    value REAL NOT NULL,
    PRIMARY KEY (entity, key)
);
"""
PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_RATE = "request_rate"
KEYS = (PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_RATE)
USER, CLIENT_ID = "user", "client-id"
#: An entity: its components, sorted, each (type, name); a name of None is that type's default.
Entity = tuple[tuple[str, str | None], ...]


class QuotaError(StratalogError, ValueError):
    """A quota entity or value that cannot be stored: the message says which part."""


@dataclass(frozen=True, slots=True)
class QuotaConfig:
    #: Defaults for every user and client id that no quota entity covers (None: unlimited).
    producer_byte_rate: float | None = None
    consumer_byte_rate: float | None = None
    request_rate: float | None = None
    #: Rates are measured over this many windows of this length (quota.window.num / .size.seconds).
    window_s: float = 1.0
    windows: int = 11
    #: No response asks a client to wait longer than this (a client's request timeout is 30 s).
    throttle_ms_max: int = 10_000
    #: Rates kept for this many users and client ids; the least recently used is forgotten beyond it,
    #: so a flood of client ids cannot grow the broker's memory.
    rates_tracked_max: int = 10_000

    def default(self, key: str) -> float | None:
        return {PRODUCER_BYTE_RATE: self.producer_byte_rate, CONSUMER_BYTE_RATE: self.consumer_byte_rate,
                REQUEST_RATE: self.request_rate}[key]


def check_entity(components: Iterable[tuple[str, str | None]]) -> Entity:
    entity = tuple(sorted(components, key=lambda c: c[0]))
    types = [t for t, _ in entity]
    if not entity or len(set(types)) != len(types) or not set(types) <= {USER, CLIENT_ID}:
        raise QuotaError(f"a quota entity is a user, a client-id, or both, not {types}")
    return entity


def check_value(key: str, value: float) -> float:
    if key not in KEYS:
        hint = " (this broker limits requests per second: request_rate)" if key == "request_percentage" else ""
        raise QuotaError(f"unknown quota {key!r}{hint}; known: {', '.join(KEYS)}")
    if not value > 0:
        raise QuotaError(f"{key} must be positive, not {value}")
    return float(value)


class Rate:
    """A rate over the last ``windows`` windows: amounts summed per window in a ring."""

    __slots__ = ("_amounts", "_starts", "_window_s")

    def __init__(self, window_s: float, windows: int) -> None:
        self._window_s = window_s
        self._amounts = [0.0] * windows
        self._starts = [-1.0] * windows

    def record(self, amount: float, now_s: float) -> tuple[float, float]:
        """Add ``amount``; return the rate per second and the span (s) it was measured over."""
        slot = int(now_s // self._window_s) % len(self._amounts)
        start = now_s - now_s % self._window_s
        if self._starts[slot] != start:
            self._starts[slot], self._amounts[slot] = start, 0.0
        self._amounts[slot] += amount
        horizon = start - self._window_s * (len(self._amounts) - 1)
        live = [(s, a) for s, a in zip(self._starts, self._amounts, strict=True) if s >= horizon]
        oldest = min(s for s, _ in live)
        # Kafka's rule: measure over at least all windows but one, so a first burst is not read as a rate
        # over a few microseconds.
        span_s = max(now_s - oldest, self._window_s * (len(self._amounts) - 1))
        return sum(a for _, a in live) / span_s, span_s


@dataclass
class Quotas:
    """Quota entities (durable in the broker's metadata: ``broker.sqlite``'s path, or a PostgreSQL URI) and
    the rates they are measured against."""

    location: Location
    config: QuotaConfig = field(default_factory=QuotaConfig)
    clock_s: Callable[[], float] = time.monotonic
    _entities: dict[Entity, dict[str, float]] = field(default_factory=dict)
    _rates: OrderedDict[tuple[str, str | None, str | None], Rate] = field(default_factory=OrderedDict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _db: Backend | None = None

    def __post_init__(self) -> None:
        self._db = open_metadata(self.location, SCHEMA)
        for entity, key, value in self._db.execute("SELECT entity, key, value FROM client_quotas").fetchall():
            parsed = tuple((t, n) for t, n in json.loads(entity))
            self._entities.setdefault(parsed, {})[key] = value

    def close(self) -> None:
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None

    # Setting quotas ---------------------------------------------------------------------------------------

    def entities(self) -> dict[Entity, dict[str, float]]:
        return {e: dict(v) for e, v in self._entities.items()}

    def check(self, entity: Entity, set_values: dict[str, float], remove: Iterable[str]) -> dict[str, float]:
        """The values checked (QuotaError names what is wrong): what ``alter`` would store."""
        check_entity(entity)
        for key in remove:
            if key not in KEYS:
                raise QuotaError(f"unknown quota {key!r}; known: {', '.join(KEYS)}")
        return {k: check_value(k, v) for k, v in set_values.items()}

    def alter(self, entity: Entity, set_values: dict[str, float], remove: Iterable[str]) -> None:
        entity = check_entity(entity)
        remove = list(remove)
        checked = self.check(entity, set_values, remove)
        with self._lock:
            assert self._db is not None
            name = json.dumps([list(c) for c in entity])
            with writing(self._db):
                self._db.executemany("INSERT INTO client_quotas VALUES (?, ?, ?) ON CONFLICT (entity, key) "
                                     "DO UPDATE SET value = excluded.value",
                                     [(name, k, v) for k, v in checked.items()])
                self._db.executemany("DELETE FROM client_quotas WHERE entity = ? AND key = ?",
                                     [(name, k) for k in remove])
            values = self._entities.setdefault(entity, {})
            values.update(checked)
            for key in remove:
                values.pop(key, None)
            if not values:
                del self._entities[entity]

    # Measuring -------------------------------------------------------------------------------------------

    def _quota(self, user: str, client_id: str, key: str) -> tuple[float, str | None, str | None] | None:
        """The quota that applies, and whose rate it is measured on (the user, the client id, or both)."""
        for entity in ((("client-id", client_id), ("user", user)), (("client-id", None), ("user", user)),
                       (("user", user),), (("client-id", client_id), ("user", None)),
                       (("client-id", None), ("user", None)), (("user", None),),
                       (("client-id", client_id),), (("client-id", None),)):
            value = self._entities.get(entity, {}).get(key)
            if value is not None:
                types = {t for t, _ in entity}
                return value, user if USER in types else None, client_id if CLIENT_ID in types else None
        default = self.config.default(key)
        return None if default is None else (default, user, client_id)

    def record(self, user: str, client_id: str, key: str, amount: float) -> int:
        """Count ``amount`` against the quota that applies; the throttle time it earns, in ms."""
        if not self._entities and self.config.default(key) is None:
            return 0  # no quota at all: the common case costs one check
        found = self._quota(user, client_id, key)
        if found is None:
            return 0
        quota, rate_user, rate_client = found
        rate_key = (key, rate_user, rate_client)
        rate = self._rates.get(rate_key)
        if rate is None:
            rate = self._rates[rate_key] = Rate(self.config.window_s, self.config.windows)
            if len(self._rates) > self.config.rates_tracked_max:
                self._rates.popitem(last=False)
        else:
            self._rates.move_to_end(rate_key)
        observed, span_s = rate.record(amount, self.clock_s())
        if observed <= quota:
            return 0
        return min(int((observed - quota) / quota * span_s * 1000), self.config.throttle_ms_max)
