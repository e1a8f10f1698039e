"""The console's HTTP server: a thread of its own (the standard library's), each request handed to
``ConsoleApp``. GET, and POST for the login form (its body bounded before it is read). Where it may
listen, and when over HTTPS, is ``broker.http_address``'s."""

from __future__ import annotations

import logging
import ssl
from http.cookies import CookieError, SimpleCookie
from http.server import BaseHTTPRequestHandler
from urllib.parse import parse_qs

from stratalog.broker.http_thread import ServingThread
from stratalog.console.app import ConsoleApp, Request

log = logging.getLogger("stratalog.console")

HTTP_PAYLOAD_TOO_LARGE = 413
HTTP_URI_TOO_LONG = 414
HTTP_INTERNAL_ERROR = 500
#: The longest request target taken (the standard library's own limit on a request line is 64 KiB).
TARGET_CHARS_MAX = 4096
#: The largest form taken (the login form's user, password and page to return to).
FORM_BYTES_MAX = 4096
#: The longest Cookie header read.
COOKIE_CHARS_MAX = 4096


class ConsoleServer(ServingThread):
    """Serve ``app`` on ``address`` until :meth:`close`."""

    def __init__(self, address: tuple[str, int], app: ConsoleApp, tls: ssl.SSLContext | None = None) -> None:
        super().__init__(address, _handler(app), "stratalog-console", tls)


def _handler(app: ConsoleApp) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self._serve("GET", {})

        def do_POST(self) -> None:
            length = self.headers.get("Content-Length", "")
            if not length.isdigit() or int(length) > FORM_BYTES_MAX:
                self._send(HTTP_PAYLOAD_TOO_LARGE, f"a form of at most {FORM_BYTES_MAX} bytes, with its length")
                return
            body = self.rfile.read(int(length)).decode("utf-8", "replace")
            self._serve("POST", {k: v[-1] for k, v in parse_qs(body).items()})

        def _serve(self, method: str, form: dict[str, str]) -> None:
            if len(self.path) > TARGET_CHARS_MAX:
                self._send(HTTP_URI_TOO_LONG, "request target too long")
                return
            cookies = SimpleCookie()
            try:
                cookies.load(self.headers.get("Cookie", "")[:COOKIE_CHARS_MAX])
            except CookieError:
                cookies = SimpleCookie()
            request = Request(method, self.path, str(self.client_address[0]),
                              {k: m.value for k, m in cookies.items()}, form)
            try:
                page = app.handle(request)
            except Exception:   # a bug shows as a 500 and a log line, never as a dead console
                log.exception("console page %s failed", self.path)
                self._send(HTTP_INTERNAL_ERROR, "the page failed: see the broker's log")
                return
            self._send(page.status, page.body, "text/html; charset=utf-8", page.headers)

        def _send(self, status: int, body: str, content_type: str = "text/plain; charset=utf-8",
                  headers: tuple[tuple[str, str], ...] = ()) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; "
                                                        "img-src 'self'; form-action 'self'")
            self.send_header("X-Content-Type-Options", "nosniff")
            self.send_header("Cache-Control", "no-store")
            for name, value in headers:
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: object) -> None:
            pass   # page views are not news

    return Handler
