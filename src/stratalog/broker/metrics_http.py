"""The operator's endpoint: ``/metrics`` (Prometheus), ``/healthz`` (the process serves) and ``/readyz``
(the broker takes writes: its store runs and has room, and in a cluster its lease is confirmed).

A thread of its own with the standard library's HTTP server: a scrape or a probe never waits for the
event loop, and reads only what the loop publishes as plain attributes. Where it may listen, and when
``/metrics`` asks for a login, is ``http_address``'s; the probes never do (an orchestrator's kubelet
asks without one, and they tell only whether the broker serves and takes writes).
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from stratalog.broker.http_login import BasicLogin
from stratalog.broker.http_thread import ServingThread

HTTP_OK = 200
HTTP_NOT_FOUND = 404
HTTP_UNAVAILABLE = 503


class MetricsEndpoint(ServingThread):
    """Serve the registry and the probes on ``address`` until :meth:`close`. ``not_ready()`` says why the
    broker does not take writes now (empty: ready); it is called in the endpoint's thread."""

    def __init__(self, address: tuple[str, int], registry: CollectorRegistry, not_ready: Callable[[], list[str]],
                 tls: ssl.SSLContext | None = None, login: BasicLogin | None = None) -> None:
        super().__init__(address, _handler(registry, not_ready, login), "stratalog-metrics", tls)


def _handler(registry: CollectorRegistry, not_ready: Callable[[], list[str]],
             login: BasicLogin | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/metrics":
                refused = login.refusal(self.headers.get("Authorization"), str(self.client_address[0])) \
                    if login is not None else None
                if refused is not None:
                    self._send(refused[0], (refused[1] + "\n").encode(),
                               headers=(("WWW-Authenticate", 'Basic realm="stratalog", charset="UTF-8"'),))
                    return
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

        def _send(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
                  headers: tuple[tuple[str, str], ...] = ()) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for name, value in headers:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass   # a scrape every few seconds is not news

    return Handler
