"""An HTTP server on a thread of its own (the standard library's): the shell of the metrics endpoint and
of the web console, so that neither waits for the broker's event loop nor holds it up."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ServingThread:
    """Serve ``handler`` on ``address`` from a thread named ``name`` until :meth:`close`."""

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], name: str) -> None:
        self._server = ThreadingHTTPServer(address, handler)
        self._server.daemon_threads = True
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
