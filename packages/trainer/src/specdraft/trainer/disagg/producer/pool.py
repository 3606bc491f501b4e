"""The capture servers a producer leases to: least-loaded choice, down-marking and dropping.

A capture failure makes the producer probe the server's health. A server that answers stays in
the pool (the failure was the request's); one that does not is marked down and gets no leases.
A monitor thread probes down servers again every `REPROBE_INTERVAL_S`: one that answers is up
again, one that has been down for `drop_after_s` is dropped for good (training goes on with
the others). With every server dropped, or none up for `drop_after_s`, leasing stops with an
error naming each server and its last error.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# How often the monitor probes down servers.
REPROBE_INTERVAL_S = 0.5


class NoCaptureServer(RuntimeError):
    """Every capture server is down or dropped."""


@dataclass
class _Server:
    client: Any
    url: str
    inflight: int = 0
    down_since: float | None = None
    last_error: str = ""
    dropped: bool = False
    captures: int = 0
    failures: int = 0

    @property
    def up(self) -> bool:
        return not self.dropped and self.down_since is None


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
            if server.url in dropped:
                server.dropped = True
                server.last_error = "dropped by an earlier producer of this run"
        self._probe_timeout_s = probe_timeout_s
        self._drop_after_s = drop_after_s
        self._on_drop = on_drop
        self._cond = threading.Condition()
        self._turn = 0
        self._stop = threading.Event()
        self._monitor = threading.Thread(
            target=self._monitor_loop, name="capture-health", daemon=True
        )

    def start(self) -> CapturePool:
        """Start the monitor that re-probes down servers; returns self."""
        self._monitor.start()
        return self

    def stop(self) -> None:
        """Stop the monitor and wake anyone waiting for a server."""
        self._stop.set()
        with self._cond:
            self._cond.notify_all()

    def acquire(self, *, timeout: float) -> Any:
        """The up server with the fewest captures in flight; waits while none is up."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                # Rotate the start so equally loaded servers take turns.
                n = len(self._servers)
                ring = [self._servers[(self._turn + i) % n] for i in range(n)]
                up = [s for s in ring if s.up]
                if up:
                    server = min(up, key=lambda s: s.inflight)
                    server.inflight += 1
                    self._turn = (self._servers.index(server) + 1) % n
                    return server.client
                if all(s.dropped for s in self._servers):
                    raise NoCaptureServer(f"every capture server is gone: {self._summary()}")
                if self._stop.is_set():
                    raise NoCaptureServer("the producer is stopping")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NoCaptureServer(
                        f"no capture server came back within {timeout:g} s "
                        f"(deployment.disaggregated.health_timeout_s): {self._summary()}"
                    )
                self._cond.wait(min(left, REPROBE_INTERVAL_S))

    def release(self, client: Any, *, ok: bool) -> None:
        """Return a server after a capture; `ok` says whether it succeeded."""
        with self._cond:
            server = self._find(client)
            server.inflight -= 1
            if ok:
                server.captures += 1
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
            elif server.down_since is None and not server.dropped:
                server.down_since = time.monotonic()
            self._cond.notify_all()
        return healthy

    def stats(self) -> dict[str, float]:
        """Servers up, down and dropped."""
        with self._cond:
            up = sum(1 for s in self._servers if s.up)
            dropped = sum(1 for s in self._servers if s.dropped)
        return {
            "producer/servers_up": float(up),
            "producer/servers_down": float(len(self._servers) - up - dropped),
            "producer/servers_dropped": float(dropped),
        }

    def _monitor_loop(self) -> None:
        while not self._stop.wait(REPROBE_INTERVAL_S):
            with self._cond:
                down = [s for s in self._servers if not s.dropped and s.down_since is not None]
            for server in down:
                healthy = self._probe(server)
                with self._cond:
                    if healthy:
                        server.down_since = None
                    self._cond.notify_all()
            self._drop_expired()

    def _probe(self, server: _Server) -> bool:
        try:
            return bool(server.client.health(timeout=self._probe_timeout_s))
        except Exception as exc:  # a dead server fails in many ways; all mean "not healthy"
            server.last_error = server.last_error or f"{type(exc).__name__}: {exc}"
            return False

    def _drop_expired(self) -> None:
        now = time.monotonic()
        dropped = []
        with self._cond:
            for s in self._servers:
                expired = s.down_since is not None and now - s.down_since >= self._drop_after_s
                if expired and not s.dropped:
                    s.dropped = True
                    dropped.append(s)
            self._cond.notify_all()
        for s in dropped:
            self._on_drop(s.url, f"down for {self._drop_after_s:g} s; last error: {s.last_error}")

    def _find(self, client: Any) -> _Server:
        for server in self._servers:
            if server.client is client:
                return server
        raise KeyError(f"capture client {client!r} is not in the pool")

    def _summary(self) -> str:
        return "; ".join(
            f"{s.url}: {'dropped' if s.dropped else 'down'} ({s.last_error or 'no answer'})"
            for s in self._servers
        )
