"""The broker's HTTP services, started beside its Kafka listeners by ``stratalog serve``: ``/metrics``
with the probes, and the web console. Each has a thread of its own; what they read of the broker's tables
they read on its loop (``LOOP_WAIT_S`` at most); where they may listen is ``broker.http_address``'s."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import ssl
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from stratalog.broker.broker import Broker
from stratalog.broker.config import BrokerConfig
from stratalog.broker.http_address import HttpAddress, HttpAddressError, parse_http_address
from stratalog.broker.http_login import BasicLogin
from stratalog.broker.listeners import server_ssl_context
from stratalog.broker.metrics import group_lags
from stratalog.broker.metrics_http import MetricsEndpoint
from stratalog.broker.server import BrokerServer

if TYPE_CHECKING:
    from stratalog.console.http import ConsoleServer

#: How long a page or a scrape waits for the broker's loop to read its tables (a loop busy for this long is
#: itself the news: the request fails with a 500 and a log line).
LOOP_WAIT_S = 10.0
METRICS, CONSOLE = "the metrics endpoint", "the console"


def check_addresses(config: BrokerConfig) -> None:
    """Refuse, as a usage error naming the option, an address a service may not listen on."""
    for text, service, option in ((config.metrics_listen, METRICS, "--metrics-listen"),
                                  (config.console_listen, CONSOLE, "--console")):
        if text is not None:
            try:
                address = parse_http_address(text, service, config.allow_plaintext_anywhere)
            except HttpAddressError as e:
                raise click.BadParameter(str(e), param_hint=option) from None
            if address.secure and config.tls.certfile is None:
                raise click.BadParameter(f"{text}: HTTPS needs the broker's certificate (--tls-cert)",
                                         param_hint=option)


def _on_loop(loop: asyncio.AbstractEventLoop) -> Callable[[Callable[[], Any]], Any]:
    async def call(fn: Callable[[], Any]) -> Any:
        return fn()

    def on_loop(fn: Callable[[], Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(call(fn), loop).result(LOOP_WAIT_S)

    return on_loop


def _tls(address: HttpAddress, config: BrokerConfig) -> ssl.SSLContext | None:
    return server_ssl_context(config.tls) if address.secure else None


def start_metrics(broker: Broker, server: BrokerServer, config: BrokerConfig,
                  loop: asyncio.AbstractEventLoop) -> tuple[MetricsEndpoint, str]:
    """The metrics endpoint, and the URL of its /metrics."""
    assert config.metrics_listen is not None
    address = parse_http_address(config.metrics_listen, METRICS, config.allow_plaintext_anywhere)
    ownership = broker.ownership
    broker.metrics.watch(lambda: {**broker.store.stats(), "connections": server.connections, **ownership.stats()},
                         functools.partial(group_lags, broker), server.connections_by_listener,
                         broker.store.collectors())
    login = BasicLogin(broker, _on_loop(loop)) if address.secure else None
    try:
        endpoint = MetricsEndpoint((address.host, address.port), broker.metrics.registry,
                                   functools.partial(not_ready, broker, server), _tls(address, config), login)
    except OSError as e:
        raise click.ClickException(f"cannot serve metrics on {config.metrics_listen}: {e.strerror}") from None
    bound = dataclasses.replace(address, host=endpoint.address[0], port=endpoint.address[1])
    return endpoint, f"{bound.url}/metrics"


@dataclasses.dataclass
class Console:
    server: ConsoleServer
    sampling: asyncio.Task[None]
    url: str

    def close(self) -> None:
        self.server.close()
        self.sampling.cancel()


def start_console(broker: Broker, server: BrokerServer, config: BrokerConfig,
                  loop: asyncio.AbstractEventLoop) -> Console:
    """The web console's server thread, and the sampler of its plots on the loop. (The console's modules,
    jinja2's templates among them, are imported here: a broker without a console does not load them.)"""
    from stratalog.console.app import ConsoleApp
    from stratalog.console.history import History
    from stratalog.console.http import ConsoleServer
    from stratalog.console.login import Sessions
    from stratalog.console.views import ConsoleData

    assert config.console_listen is not None
    address = parse_http_address(config.console_listen, CONSOLE, config.allow_plaintext_anywhere)
    on_loop = _on_loop(loop)
    history = History()
    sampling = loop.create_task(history.run(broker))
    data = ConsoleData(broker, on_loop, history, lambda: server.connections)
    app = ConsoleApp(data, Sessions(broker, on_loop, always=address.secure), secure=address.secure)
    try:
        console = ConsoleServer((address.host, address.port), app, _tls(address, config))
    except OSError as e:
        sampling.cancel()
        raise click.ClickException(f"cannot serve the console on {config.console_listen}: {e.strerror}") from None
    bound = dataclasses.replace(address, host=console.address[0], port=console.address[1])
    return Console(console, sampling, bound.url)


def not_ready(broker: Broker, server: BrokerServer) -> list[str]:
    """Why the broker does not take writes now (/readyz); called in the metrics endpoint's thread."""
    reasons = []
    if server.stopping:
        reasons.append("stopping")
    failure = broker.store.failure
    if failure is not None:
        reasons.append(f"the store stopped after an error: {failure}")
    refusal = broker.store.space_refusal
    if refusal is not None:
        reasons.append(f"not writable: {refusal}")
    if not broker.ownership.may_acknowledge():
        reasons.append("the cluster lease is not confirmed (the metadata database is out of reach)")
    return reasons
