"""Small JSON-over-HTTP plumbing shared by the embedded capture server, the SGLang stub and
their clients: stdlib only, loopback by default, one thread per request.
"""

from __future__ import annotations

import http.client
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# A route returns (status, JSON body).
Route = Callable[[Any], tuple[int, Any]]

# Refuse request bodies above this before reading them: a prompt of 1M token ids is ~8 MB.
MAX_BODY_BYTES = 64 << 20


class JsonServer:
    """A ThreadingHTTPServer with JSON routes, run on a background thread."""

    def __init__(
        self,
        routes: dict[tuple[str, str], Route],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        name: str = "json-server",
    ) -> None:
        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                # Request lines would drown the run's logs; errors are reported in replies.
                pass

            def _dispatch(self, method: str) -> None:
                path = self.path.split("?", 1)[0]
                route = routes.get((method, path))
                if route is None:
                    self._send(404, {"error": f"no route {method} {path}"})
                    return
                body: Any = None
                if method == "POST":
                    length = int(self.headers.get("Content-Length") or 0)
                    if length > MAX_BODY_BYTES:
                        self._send(413, {"error": f"request body of {length} bytes is too large"})
                        return
                    raw = self.rfile.read(length)
                    try:
                        body = json.loads(raw or b"null")
                    except ValueError as exc:
                        self._send(400, {"error": f"request body is not JSON: {exc}"})
                        return
                try:
                    status, payload = route(body)
                except Exception as exc:  # a route bug must answer, not hang the client
                    status, payload = 500, {"error": f"{type(exc).__name__}: {exc}"}
                self._send(status, payload)

            def _send(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._dispatch("GET")

            def do_POST(self) -> None:
                self._dispatch("POST")

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self._thread: threading.Thread | None = None
        self._name = name

    @property
    def port(self) -> int:
        """The bound port (the real one when 0 was asked for)."""
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """Base URL, e.g. http://127.0.0.1:41234."""
        host = self._httpd.server_address[0]
        return f"http://{host}:{self.port}"

    def start(self) -> JsonServer:
        """Serve on a daemon thread; returns self."""
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name=self._name, daemon=True
        )
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve on the calling thread until `stop` (from another thread or a signal)."""
        self._httpd.serve_forever()

    def stop(self) -> None:
        """Stop serving (on a thread or in `serve_forever` elsewhere) and close the socket."""
        # shutdown() returns at once when nothing serves, and otherwise waits for the loop.
        self._httpd.shutdown()
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None
        self._httpd.server_close()

    def __enter__(self) -> JsonServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class JsonService:
    """Base of the services built on a JsonServer: the lifecycle, delegated to one server."""

    _http: JsonServer

    @property
    def url(self) -> str:
        """Base URL clients talk to."""
        return self._http.url

    def start(self) -> Any:
        """Serve on a daemon thread; returns self."""
        self._http.start()
        return self

    def serve_forever(self) -> None:
        """Serve on the calling thread until `stop`."""
        self._http.serve_forever()

    def stop(self) -> None:
        """Stop serving and close the socket."""
        self._http.stop()

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class HttpFailure(Exception):
    """An HTTP exchange that failed: `kind` is 'unavailable', 'timeout' or 'status'."""

    def __init__(self, kind: str, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status


def call_json(method: str, url: str, payload: Any = None, *, timeout: float) -> Any:
    """One JSON request; returns the decoded body of a 2xx answer, else raises HttpFailure."""
    data = None if payload is None else json.dumps(payload).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            body = response.read()
    except urllib.error.HTTPError as exc:
        detail = _error_detail(exc)
        raise HttpFailure(
            "status", f"{method} {url} answered {exc.code}: {detail}", exc.code
        ) from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError):
            raise HttpFailure("timeout", f"{method} {url} timed out after {timeout:g} s") from None
        raise HttpFailure("unavailable", f"{method} {url} failed: {exc.reason}") from None
    except TimeoutError:
        raise HttpFailure("timeout", f"{method} {url} timed out after {timeout:g} s") from None
    except (ConnectionError, http.client.HTTPException, OSError) as exc:
        raise HttpFailure("unavailable", f"{method} {url} failed: {exc}") from None
    if not body:
        return None
    try:
        return json.loads(body)
    except ValueError as exc:
        raise HttpFailure("status", f"{method} {url} answered with non-JSON: {exc}") from None


def _error_detail(exc: urllib.error.HTTPError) -> str:
    try:
        body = exc.read().decode(errors="replace")
    except Exception:
        return exc.reason or ""
    try:
        parsed = json.loads(body)
    except ValueError:
        return body[:500]
    if isinstance(parsed, dict) and "error" in parsed:
        return str(parsed["error"])
    return body[:500]
