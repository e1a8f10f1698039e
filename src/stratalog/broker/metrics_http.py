"""The operator's endpoint: ``/metrics`` (Prometheus), ``/healthz`` (the process serves) and ``/readyz``
(the broker takes writes: its store runs and has room, and in a cluster its lease is confirmed).

A thread of its own with the standard library's HTTP server: a scrape or a probe never waits for the
event loop, and reads only what the loop publishes as plain attributes. It binds loopback addresses only:
the Kafka listeners' rules for exposing a port (TLS, SASL) do not cover it yet.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from stratalog.broker.http_thread import ServingThread

HTTP_OK = 200
HTTP_NOT_FOUND = 404
HTTP_UNAVAILABLE = 503


class MetricsEndpointError(ValueError):
    """The endpoint's address is not one it may bind."""


def parse_address(text: str, service: str = "the metrics endpoint") -> tuple[str, int]:
    """``HOST:PORT`` of a loopback address (127.0.0.0/8 or ::1); MetricsEndpointError otherwise, naming
    ``service``."""
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not port.isdigit() or not host:
        raise MetricsEndpointError(f"{text!r} is not HOST:PORT (for example 127.0.0.1:9644)")
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise MetricsEndpointError(f"{host} is not a loopback address: {service} has no authentication "
                                   "yet, so it binds 127.0.0.1 or ::1 only (reach it through a local agent or "
                                   "a tunnel)")
    return host, int(port)


class MetricsEndpoint(ServingThread):
    """Serve the registry and the probes on ``address`` until :meth:`close`. ``not_ready()`` says why the
    broker does not take writes now (empty: ready); it is called in the endpoint's thread."""

    def __init__(self, address: tuple[str, int], registry: CollectorRegistry,
                 not_ready: Callable[[], list[str]]) -> None:
        super().__init__(address, _handler(registry, not_ready), "stratalog-metrics")


def _handler(registry: CollectorRegistry, not_ready: Callable[[], list[str]]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                self._send(HTTP_OK, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":
                self._send(HTTP_OK, b"ok\n")
            elif path == "/readyz":
                reasons = not_ready()
                if reasons:
                    self._send(HTTP_UNAVAILABLE, ("not ready: " + "; ".join(reasons) + "\n").encode())
                else:
                    self._send(HTTP_OK, b"ready\n")
            else:
                self._send(HTTP_NOT_FOUND, b"not found: /metrics, /healthz and /readyz are served\n")

        def _send(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass   # a scrape every few seconds is not news

    return Handler
