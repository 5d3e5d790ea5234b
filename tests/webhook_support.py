"""A real webhook for tests: an HTTP server on loopback that keeps every JSON body POSTed to it.

Use as a context manager::

    with Webhook() as hook:            # answers 200; Webhook(status=500) refuses
        ...  # point a connection at hook.url
    assert hook.received == [{...}]
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any


class Webhook:
    """An HTTP server on 127.0.0.1 (a free port) recording POSTs: ``received`` bodies, ``paths``, ``headers``."""

    def __init__(self, status: int = 200) -> None:
        self.status = status
        self.received: list[dict[str, Any]] = []
        self.paths: list[str] = []
        self.headers: list[dict[str, str]] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hook.received.append(json.loads(body))
                hook.paths.append(self.path)
                hook.headers.append(dict(self.headers))
                self.send_response(hook.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hooks/T0/B0/secret"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def connection(self) -> str:
        """The connection's JSON, for ``AIRFLOW_CONN_<ID>``: an HTTP connection whose host is the whole URL."""
        return json.dumps({"conn_type": "http", "host": self.url})

    def __enter__(self) -> Webhook:
        self.thread.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)
