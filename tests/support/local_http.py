"""Small HTTP servers on this machine for tests that play a provider's part (a refusing store, a token service)."""

import contextlib
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class QuietHandler(BaseHTTPRequestHandler):
    """A request handler that logs nothing and answers JSON in one call."""

    def answer_json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        return


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler], **attributes: Any) -> Iterator[Any]:
    """
    A threaded HTTP server on a free loopback port, with `attributes` set on it (what its handlers read and record
    through ``self.server``), shut down on exit.

    :param handler: The request handler class.
    :param attributes: Attributes for the server object.
    :returns: The server (``server.server_address[1]`` is its port).
    """
    server: Any = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    for name, value in attributes.items():
        setattr(server, name, value)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
