"""A bounded JSON-over-HTTP server, stdlib only, loopback by default: the disaggregated
runtime's capture servers and window controller are built on it (`JsonServer`, `JsonService`).

What a hostile or broken client cannot do to a `JsonServer`:
- without the run's secret (when the server has one) it gets 401 and reaches no route but
  `GET /health`; the comparison is constant-time (`hmac.compare_digest`);
- a missing, negative, non-numeric, repeated or oversized `Content-Length`, or a chunked body,
  gets a 4xx reply before any body is read; so does JSON nested deeper than `MAX_JSON_DEPTH`,
  `NaN` / `Infinity`, or anything else that is not JSON;
- idle connections hold no thread: a connection waits in one selector thread until its first
  bytes arrive (and is closed after `IDLE_TIMEOUT_S`), and requests run on at most
  `max_workers` threads; beyond `max_waiting` idle connections, new ones are closed.
Every answer closes its connection (the clients make one request per connection), so a
keep-alive client cannot hold a worker either. The client side is `http_client`, the secret
`run_secret`.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import queue
import re
import selectors
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

from .run_secret import SECRET_ENV

log = logging.getLogger(__name__)

# A route returns (status, JSON body).
Route = Callable[[Any], tuple[int, Any]]

# Refuse request bodies above this before reading them: a prompt of 1M token ids is ~8 MB.
MAX_BODY_BYTES = 64 << 20
# No request of the runtime nests deeper than 3; json.loads would recurse (and the thread die
# of RecursionError) on a few thousand levels.
MAX_JSON_DEPTH = 32
# Threads serving requests per server; a connection costs none until its request arrives.
MAX_WORKERS = 16
# Connections waiting for their first bytes; more are closed at once.
MAX_WAITING = 1024
# A connection that sends no request within this is closed; a slow client that stops halfway
# through its request is cut off after the same time without bytes.
IDLE_TIMEOUT_S = 30.0

# The one route a client without the secret may call: it changes nothing and says only
# whether the service is up (the supervisor's and the user's liveness probe).
OPEN_ROUTES = frozenset({("GET", "/health")})

_CONTENT_LENGTH_RE = re.compile(r"[0-9]{1,19}")
# A JSON document's nesting is decided by brackets outside strings; an escape is one token,
# so `\"` never ends a string.
_JSON_STRUCTURE_RE = re.compile(rb'\\.|["\[\]{}]', re.DOTALL)


class RequestRefused(Exception):
    """A request the server answers with a 4xx before any route runs."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def json_too_deep(raw: bytes, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the JSON text `raw` nests arrays/objects deeper than `limit` (no parsing)."""
    depth = 0
    in_string = False
    for match in _JSON_STRUCTURE_RE.finditer(raw):
        token = match.group()
        if in_string:
            in_string = token != b'"'
        elif token == b'"':
            in_string = True
        elif token in (b"[", b"{"):
            depth += 1
            if depth > limit:
                return True
        elif token in (b"]", b"}"):
            depth -= 1
    return False


def _refuse_constant(name: str) -> Any:
    # json.loads accepts NaN and Infinity by default; no field of the runtime may be either.
    raise ValueError(f"{name} is not a number this service accepts")


def parse_json_body(raw: bytes) -> Any:
    """Decode a request body, refusing deep nesting and NaN/Infinity; RequestRefused (400)."""
    if json_too_deep(raw):
        raise RequestRefused(400, f"request body nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        return json.loads(raw or b"null", parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        raise RequestRefused(400, f"request body is not JSON: {exc}") from None


def content_length(values: list[str] | None, *, limit: int) -> int:
    """The body length a request announces; RequestRefused (400 / 413) for any bad value."""
    if not values:
        return 0
    distinct = {v.strip() for v in values}
    if len(distinct) > 1:
        raise RequestRefused(400, f"conflicting Content-Length headers {sorted(distinct)}")
    raw = distinct.pop()
    if not _CONTENT_LENGTH_RE.fullmatch(raw):
        raise RequestRefused(400, f"Content-Length {raw!r} is not a non-negative integer")
    length = int(raw)
    if length > limit:
        raise RequestRefused(
            413, f"request body of {length} bytes is above this service's limit of {limit}"
        )
    return length


class _BoundedHTTPServer(HTTPServer):
    """An HTTPServer whose idle connections wait in one selector and whose requests run on a
    bounded set of worker threads (ThreadingHTTPServer starts a thread per connection)."""

    # The listen backlog: socketserver's default of 5 drops connection bursts (the clients
    # then wait seconds for SYN retries); accepting is cheap now, so let them queue.
    request_queue_size = 1024

    def __init__(
        self,
        address: tuple[str, int],
        handler: type[BaseHTTPRequestHandler],
        *,
        name: str,
        max_workers: int,
        max_waiting: int,
        idle_timeout_s: float,
    ) -> None:
        super().__init__(address, handler)
        self._name = name
        self._max_workers = max(1, max_workers)
        self._max_waiting = max_waiting
        self._idle_timeout_s = idle_timeout_s
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[socket.socket, Any] | None] = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._busy = 0
        self._arrivals: queue.SimpleQueue[tuple[socket.socket, Any]] = queue.SimpleQueue()
        self._wake_r, self._wake_w = socket.socketpair()
        self._closed = threading.Event()
        self._lobby = threading.Thread(target=self._lobby_loop, name=f"{name}-lobby", daemon=True)
        self._lobby.start()

    @property
    def worker_count(self) -> int:
        """Worker threads started so far (never above max_workers)."""
        return len(self._workers)

    def process_request(self, request: Any, client_address: Any) -> None:
        """Hand an accepted connection to the lobby, which waits for its first bytes."""
        self._arrivals.put((request, client_address))
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")

    def _lobby_loop(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._wake_r, selectors.EVENT_READ)
        waiting: dict[socket.socket, tuple[Any, float]] = {}
        try:
            while not self._closed.is_set():
                timeout = self._idle_timeout_s
                if waiting:
                    timeout = max(0.0, min(d for _, d in waiting.values()) - time.monotonic())
                for key, _ in selector.select(timeout=min(timeout, 1.0)):
                    if key.fileobj is self._wake_r:
                        with contextlib.suppress(OSError):
                            self._wake_r.recv(4096)
                        continue
                    sock = key.fileobj
                    selector.unregister(sock)
                    address, _ = waiting.pop(sock)
                    self._submit(sock, address)
                while True:
                    try:
                        sock, address = self._arrivals.get_nowait()
                    except queue.Empty:
                        break
                    if len(waiting) >= self._max_waiting:
                        self.shutdown_request(sock)
                        continue
                    try:
                        selector.register(sock, selectors.EVENT_READ)
                    except (ValueError, OSError):
                        self.shutdown_request(sock)
                        continue
                    waiting[sock] = (address, time.monotonic() + self._idle_timeout_s)
                now = time.monotonic()
                for sock in [s for s, (_, d) in waiting.items() if d <= now]:
                    selector.unregister(sock)
                    del waiting[sock]
                    self.shutdown_request(sock)
        finally:
            for sock in waiting:
                self.shutdown_request(sock)
            selector.close()

    def _submit(self, sock: socket.socket, address: Any) -> None:
        with self._lock:
            if self._busy >= self._max_workers + self._max_waiting:
                # Requests queue behind busy workers; past this many, new ones are dropped.
                self.shutdown_request(sock)
                return
            self._busy += 1
            if self._busy > len(self._workers) and len(self._workers) < self._max_workers:
                worker = threading.Thread(
                    target=self._work, name=f"{self._name}-{len(self._workers)}", daemon=True
                )
                self._workers.append(worker)
                worker.start()
        self._jobs.put((sock, address))

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            sock, address = job
            try:
                self.finish_request(sock, address)
            except Exception as exc:  # a client that vanished mid-answer; nothing to tell
                log.debug("%s: request from %s failed: %s", self._name, address, exc)
            finally:
                self.shutdown_request(sock)
                with self._lock:
                    self._busy -= 1

    def server_close(self) -> None:
        """Close the listening socket, the waiting connections and the workers."""
        super().server_close()
        self._closed.set()
        with contextlib.suppress(OSError):
            self._wake_w.send(b"\0")
        self._lobby.join(timeout=5)
        for sock in (self._wake_r, self._wake_w):
            sock.close()
        # Workers in a long poll finish it; they are daemons and take no new job.
        for _ in self._workers:
            self._jobs.put(None)


class JsonServer:
    """JSON routes on a bounded HTTP server, run on a background thread.

    With a `secret`, every route but `GET /health` needs `Authorization: Bearer <secret>`.
    """

    def __init__(
        self,
        routes: dict[tuple[str, str], Route],
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        name: str = "json-server",
        secret: str | None = None,
        max_body_bytes: int = MAX_BODY_BYTES,
        max_workers: int = MAX_WORKERS,
        max_waiting: int = MAX_WAITING,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        expected = f"Bearer {secret}".encode() if secret else None

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Socket timeout for reading a request: a client that stalls mid-request is cut off.
            timeout = idle_timeout_s

            def log_message(self, format: str, *args: Any) -> None:
                # Request lines would drown the run's logs; errors are reported in replies.
                pass

            def _authorized(self, method: str, path: str) -> bool:
                if expected is None or (method, path) in OPEN_ROUTES:
                    return True
                given = (self.headers.get("Authorization") or "").encode("utf-8", "replace")
                return hmac.compare_digest(given, expected)

            def _read_body(self) -> Any:
                if self.headers.get("Transfer-Encoding"):
                    raise RequestRefused(411, "chunked request bodies are not accepted")
                length = content_length(
                    self.headers.get_all("Content-Length"), limit=max_body_bytes
                )
                raw = self.rfile.read(length)
                if len(raw) != length:
                    raise RequestRefused(
                        400, f"request body ended after {len(raw)} of {length} bytes"
                    )
                return parse_json_body(raw)

            def _dispatch(self, method: str) -> None:
                path = self.path.split("?", 1)[0]
                try:
                    if not self._authorized(method, path):
                        raise RequestRefused(
                            401,
                            "missing or wrong run secret: send 'Authorization: Bearer <secret>' "
                            "with the secret from <output_dir>/disagg/secret (or "
                            f"${SECRET_ENV})",
                        )
                    route = routes.get((method, path))
                    if route is None:
                        raise RequestRefused(404, f"no route {method} {path}")
                    body = self._read_body() if method == "POST" else None
                except RequestRefused as exc:
                    self._send(exc.status, {"error": str(exc)})
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
                # One request per connection: an unread body or a keep-alive client must not
                # hold this worker.
                self.send_header("Connection", "close")
                self.end_headers()
                with contextlib.suppress(OSError):
                    self.wfile.write(data)

            def do_GET(self) -> None:
                self._dispatch("GET")

            def do_POST(self) -> None:
                self._dispatch("POST")

        self._httpd = _BoundedHTTPServer(
            (host, port),
            Handler,
            name=name,
            max_workers=max_workers,
            max_waiting=max_waiting,
            idle_timeout_s=idle_timeout_s,
        )
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

    @property
    def worker_count(self) -> int:
        """Request threads started so far (bounded by max_workers)."""
        return self._httpd.worker_count

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
