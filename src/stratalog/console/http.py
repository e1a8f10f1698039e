"""The console's HTTP server: a thread of its own (the standard library's), each request handed to
``ConsoleApp``. GET only; loopback addresses only, as the metrics endpoint, until it has a login."""

from __future__ import annotations

import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from stratalog.console.app import ConsoleApp

log = logging.getLogger("stratalog.console")

HTTP_METHOD_NOT_ALLOWED = 405
HTTP_INTERNAL_ERROR = 500
#: The longest request target taken (the standard library's own limit on a request line is 64 KiB).
TARGET_CHARS_MAX = 4096


class ConsoleServer:
    """Serve ``app`` on ``address`` until :meth:`close`."""

    def __init__(self, address: tuple[str, int], app: ConsoleApp) -> None:
        self._server = ThreadingHTTPServer(address, _handler(app))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="stratalog-console", daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


def _handler(app: ConsoleApp) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if len(self.path) > TARGET_CHARS_MAX:
                self._send(HTTP_METHOD_NOT_ALLOWED, "request target too long")
                return
            try:
                page = app.handle(self.path)
            except Exception:   # a bug shows as a 500 and a log line, never as a dead console
                log.exception("console page %s failed", self.path)
                self._send(HTTP_INTERNAL_ERROR, "the page failed: see the broker's log")
                return
            self._send(page.status, page.body, "text/html; charset=utf-8")

        def do_POST(self) -> None:
            self._send(HTTP_METHOD_NOT_ALLOWED, "the console is read-only")

        def _send(self, status: int, body: str, content_type: str = "text/plain; charset=utf-8") -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; "
                                                        "img-src 'self'; form-action 'self'")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass   # page views are not news

    return Handler
