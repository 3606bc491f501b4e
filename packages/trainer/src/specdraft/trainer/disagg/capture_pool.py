"""The capture servers a producer leases to: least-loaded choice, down-marking and dropping.

A capture failure makes the producer probe the server's health. A server that answers stays in
the pool (the failure was the request's); one that does not is marked down and gets no leases,
is probed again while it is down, and is dropped for good once it has been down for
`drop_after_s` (training goes on with the others). With every server dropped the producer
stops with an error naming each server and its last error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

# How often a down server is probed again while the producer waits for one.
REPROBE_INTERVAL_S = 0.5


class NoCaptureServer(RuntimeError):
    """Every capture server is down or dropped."""


@dataclass
class _Server:
    client: Any
    url: str
    inflight: int = 0
    down_since: float | None = None
    last_probe: float = 0.0
    last_error: str = ""
    dropped: bool = False
    captures: int = 0
    failures: int = field(default=0)


class CapturePool:
    """Capture clients with their load and health; thread-safe."""

    def __init__(
        self,
        clients: Sequence[Any],
        *,
        probe_timeout_s: float,
        drop_after_s: float,
        on_drop: Callable[[str, str], None] = lambda url, reason: None,
        dropped: Sequence[str] = (),
    ) -> None:
        if not clients:
            raise ValueError(
                "no capture server: set deployment.disaggregated.capture_urls or run managed"
            )
        self._servers = [_Server(c, str(getattr(c, "url", repr(c)))) for c in clients]
        for server in self._servers:
            # Dropped by an earlier producer of this run (ledger): stays dropped.
            server.dropped = server.url in dropped
        self._probe_timeout_s = probe_timeout_s
        self._drop_after_s = drop_after_s
        self._on_drop = on_drop
        self._cond = threading.Condition()

    def acquire(self, *, timeout: float, stop: threading.Event | None = None) -> Any:
        """The up server with the fewest captures in flight; waits (re-probing) while none is up."""
        deadline = time.monotonic() + timeout
        while True:
            with self._cond:
                up = [s for s in self._servers if not s.dropped and s.down_since is None]
                if up:
                    server = min(up, key=lambda s: s.inflight)
                    server.inflight += 1
                    return server.client
            self._reprobe_down()
            if all(s.dropped for s in self._servers):
                raise NoCaptureServer(self._all_down_message())
            if time.monotonic() >= deadline:
                raise NoCaptureServer(
                    f"no capture server came back within {timeout:.0f} s "
                    f"(deployment.disaggregated.health_timeout_s): {self._all_down_message()}"
                )
            if stop is not None and stop.is_set():
                raise NoCaptureServer("producer stopping")
            time.sleep(REPROBE_INTERVAL_S / 5)

    def release(self, client: Any, *, ok: bool) -> None:
        """Return a server after a capture; `ok` says whether it succeeded."""
        with self._cond:
            server = self._find(client)
            server.inflight -= 1
            if ok:
                server.captures += 1
                server.down_since = None
            else:
                server.failures += 1

    def report_failure(self, client: Any, error: str) -> bool:
        """Probe a server after a failed capture; mark it down if unhealthy. True if still up."""
        with self._cond:
            server = self._find(client)
            server.last_error = error
        healthy = self._probe(server)
        with self._cond:
            if healthy:
                server.down_since = None
            elif server.down_since is None:
                server.down_since = time.monotonic()
        self._drop_expired()
        return healthy

    def _probe(self, server: _Server) -> bool:
        server.last_probe = time.monotonic()
        try:
            return bool(server.client.health(timeout=self._probe_timeout_s))
        except Exception as exc:  # a dead server fails in many ways; all mean "not healthy"
            server.last_error = server.last_error or f"{type(exc).__name__}: {exc}"
            return False

    def _reprobe_down(self) -> None:
        now = time.monotonic()
        with self._cond:
            due = [
                s
                for s in self._servers
                if not s.dropped
                and s.down_since is not None
                and now - s.last_probe >= REPROBE_INTERVAL_S
            ]
        for server in due:
            if self._probe(server):
                with self._cond:
                    server.down_since = None
        self._drop_expired()

    def _drop_expired(self) -> None:
        now = time.monotonic()
        dropped = []
        with self._cond:
            for s in self._servers:
                if s.dropped or s.down_since is None:
                    continue
                if now - s.down_since >= self._drop_after_s:
                    s.dropped = True
                    dropped.append(s)
        for s in dropped:
            self._on_drop(s.url, f"down for {self._drop_after_s:.0f} s; last error: {s.last_error}")

    def _find(self, client: Any) -> _Server:
        for server in self._servers:
            if server.client is client:
                return server
        raise KeyError(f"capture client {client!r} is not in the pool")

    def _all_down_message(self) -> str:
        return "; ".join(
            f"{s.url}: {'dropped' if s.dropped else 'down'} ({s.last_error or 'no answer'})"
            for s in self._servers
        )

    def stats(self) -> dict[str, float]:
        """Servers up, down and dropped."""
        with self._cond:
            up = sum(1 for s in self._servers if not s.dropped and s.down_since is None)
            dropped = sum(1 for s in self._servers if s.dropped)
            return {
                "producer/servers_up": float(up),
                "producer/servers_down": float(len(self._servers) - up - dropped),
                "producer/servers_dropped": float(dropped),
            }
