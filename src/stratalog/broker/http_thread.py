"""An HTTP server on a thread of its own (the standard library's): the shell of the metrics endpoint and
of the web console, so that neither waits for the broker's event loop nor holds it up."""

from __future__ import annotations

import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ServingThread:
    """Serve ``handler`` on ``address`` from a thread named ``name`` until :meth:`close`; over TLS with
    ``tls``."""

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], name: str,
                 tls: ssl.SSLContext | None = None) -> None:
        self._server = ThreadingHTTPServer(address, handler)
        self._server.daemon_threads = True
        if tls is not None:
            # The handshake on a request's own thread, at its first read: a client that stalls in it holds up
            # no other.
            self._server.socket = tls.wrap_socket(self._server.socket, server_side=True,
                                                  do_handshake_on_connect=False)
        self._thread = threading.Thread(target=self._server.serve_forever, name=name, daemon=True)
        self._thread.start()

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
