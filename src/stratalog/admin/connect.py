"""How the admin tools connect: librdkafka's settings from a bootstrap list, a properties file and
``-X name=value`` pairs, and Kafka errors turned into one error type with the error's name.

Settings use librdkafka's names (``security.protocol``, ``sasl.mechanism``, ``sasl.username``,
``sasl.password``, ``ssl.ca.location``, ...), as Kafka's own client properties files mostly do; a later
source overrides an earlier one: the file, then ``-X``, then ``--bootstrap``.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from stratalog.errors import StratalogError

#: The bootstrap servers when none are given: `stratalog serve`'s own default listener.
BOOTSTRAP_DEFAULT = "127.0.0.1:9092"
#: How long one admin request (or the broker's metadata) may take: a healthy broker answers in milliseconds;
#: a cluster moving a lease may take seconds.
REQUEST_TIMEOUT_S = 30.0
#: While a request waits, how often librdkafka's own errors (a refused login) are looked at.
ERRORS_POLL_S = 0.05
#: librdkafka's errors that retrying will not mend: a refused login, a TLS handshake that failed.
LASTING_ERRORS = ("_AUTHENTICATION", "_SSL")
#: Settings that are not librdkafka's but Java's: named in the error instead of passed on to fail obscurely.
JAVA_ONLY = ("sasl.jaas.config", "ssl.truststore.location", "ssl.keystore.location")


class AdminError(StratalogError):
    """A broker refused or failed a request; the message names what was asked and Kafka's error."""


def read_properties(path: Path) -> dict[str, str]:
    """``name=value`` lines of a client properties file (``#`` and ``!`` start comments; ``:`` also
    separates, as in Java's properties). Raises AdminError naming the line that is neither."""
    settings: dict[str, str] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find("="), line.find(":")) if i > 0), default=-1)
        if cut < 0:
            raise AdminError(f"{path}:{number}: expected name=value, got {line!r}")
        settings[line[:cut].strip()] = line[cut + 1:].strip()
    return settings


def parse_pairs(pairs: Iterable[str], what: str = "-X") -> dict[str, str]:
    """``name=value`` strings as a dict; AdminError naming the one without ``=``."""
    settings = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip():
            raise AdminError(f"{what} {pair!r}: expected name=value")
        settings[name.strip()] = value
    return settings


def client_settings(bootstrap: str | None, properties: Path | None = None,
                    overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """librdkafka's settings for a client of ``bootstrap`` (host:port[,host:port...])."""
    settings = read_properties(properties) if properties is not None else {}
    settings.update(overrides or {})
    if bootstrap is not None:
        settings["bootstrap.servers"] = bootstrap
    settings.setdefault("bootstrap.servers", BOOTSTRAP_DEFAULT)
    java = [name for name in JAVA_ONLY if name in settings]
    if java:
        raise AdminError(f"{', '.join(java)}: Java client settings; use librdkafka's (sasl.username, "
                         "sasl.password, ssl.ca.location, ...)")
    return settings


def describe_error(error: BaseException) -> str:
    """A Kafka error as its name and message (KafkaException carries a KafkaError), anything else as text."""
    inner: Any = error.args[0] if error.args else None
    if hasattr(inner, "name") and hasattr(inner, "str"):
        return f"{inner.name()}: {inner.str()}"
    return str(error) or type(error).__name__


def answer(admin: Any, future: concurrent.futures.Future[Any], what: str, timeout_s: float = REQUEST_TIMEOUT_S) -> Any:
    """A confluent-kafka future's result, or AdminError naming ``what`` and the Kafka error; a refused
    login or a failed TLS handshake of ``admin`` (see :func:`admin_client`) ends the wait at once."""
    deadline = time.monotonic() + timeout_s
    while not concurrent.futures.wait([future], ERRORS_POLL_S).done:
        if time.monotonic() > deadline:
            raise AdminError(f"{what}: no answer within {timeout_s:g} s")
        refused = _lasting_error(admin)
        if refused is not None:
            raise AdminError(f"{what}: {refused}")
    # The failure is taken as a value, not raised by result(): raised, it would hold this frame (and so the
    # future and the client) in its traceback while the future holds it, a cycle that keeps the client and
    # its threads, retrying a refused login for good, until the garbage collector next looks for cycles.
    error = future.exception(0)   # KafkaException, or ValueError/TypeError for what librdkafka refuses to send
    if error is not None:
        raise AdminError(f"{what}: {describe_error(error)}")
    return future.result(0)


def _lasting_error(admin: Any) -> str | None:
    """What the error callback of :func:`admin_client` raised while ``admin`` was polled, or None. The
    error's traceback is dropped: confluent-kafka keeps what a callback raised with the client, and through
    the traceback's frames it would hold the client itself, the same cycle as above."""
    try:
        admin.poll(0)
    except AdminError as e:
        e.__traceback__ = None
        return str(e)
    return None


def admin_client(settings: Mapping[str, str]) -> Any:
    """A confluent-kafka AdminClient over ``settings`` whose requests end at once, with AdminError, when
    the brokers refuse its login or its TLS handshake fails: librdkafka itself retries a login until the
    request times out, and says why only in its log."""
    from confluent_kafka.admin import AdminClient

    def lasting(error: Any) -> None:   # served by poll(), which raises what this raises
        if error.fatal() or error.name() in LASTING_ERRORS:
            raise AdminError(f"{error.name()}: {error.str()}")

    config: dict[str, Any] = {**settings, "error_cb": lasting}
    return AdminClient(config)
