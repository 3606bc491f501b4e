"""The window controller: the producer's HTTP face towards the trainer ranks.

Routes, status codes, the long-poll cap and the address file are the contract in
`wire.windows`; this module serves it.
"""

from __future__ import annotations

import math
from typing import Any

from ...runtime.http_server import JsonServer, JsonService
from ..wire.refs import window_to_json
from ..wire.windows import (
    MAX_POLL_S,
    STATUS_BAD_REQUEST,
    STATUS_CONFLICT,
    STATUS_OUT_OF_RANGE,
    STATUS_PRODUCER_FAILED,
)
from .machine import ProducerError, StepAlreadyTrained, StepNotDelivered, StepOutOfRange
from .producer import Producer

# The controller's requests are a few small fields; nothing near this is legitimate.
MAX_CONTROLLER_BODY_BYTES = 64 << 10

# Producer exceptions -> HTTP status; the client turns them back into the same meaning.
_STATUS = (
    (StepOutOfRange, STATUS_OUT_OF_RANGE),
    (StepAlreadyTrained, STATUS_CONFLICT),
    (StepNotDelivered, STATUS_CONFLICT),
    (ProducerError, STATUS_PRODUCER_FAILED),
    (ValueError, STATUS_BAD_REQUEST),
    (LookupError, STATUS_BAD_REQUEST),
)


class WindowController(JsonService):
    """Serves a producer's windows over HTTP; `start()` runs it on a background thread.

    With a `secret` (the run's, as every process the runtime starts has), requests without it
    get 401 and change nothing.
    """

    def __init__(
        self,
        producer: Producer,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        secret: str | None = None,
    ) -> None:
        self.producer = producer
        world_size = int(producer.plan_info().get("world_size", 1))
        self._http = JsonServer(
            {
                ("GET", "/health"): self._health,
                ("GET", "/plan"): lambda _: (200, producer.plan_info()),
                ("GET", "/stats"): lambda _: (200, producer.stats()),
                ("POST", "/window"): self._guard(self._window),
                ("POST", "/ack"): self._guard(self._ack),
                ("POST", "/resume"): self._guard(self._resume),
            },
            host=host,
            port=port,
            name="window-controller",
            secret=secret,
            max_body_bytes=MAX_CONTROLLER_BODY_BYTES,
            # Each rank holds at most one long poll; leave room for acks, stats and resumes.
            max_workers=2 * world_size + 8,
        )

    def _health(self, _body: Any) -> tuple[int, Any]:
        failure = self.producer.failure
        return 200, {
            "status": "failed" if failure else "ok",
            "error": str(failure) if failure else None,
            "done": self.producer.done(),
        }

    @staticmethod
    def _guard(route: Any) -> Any:
        def guarded(body: Any) -> tuple[int, Any]:
            if not isinstance(body, dict):
                return 400, {"error": "expected a JSON object"}
            try:
                return 200, route(body)
            except Exception as exc:
                for kind, status in _STATUS:
                    if isinstance(exc, kind):
                        return status, {"error": str(exc), "kind": type(exc).__name__}
                raise

        return guarded

    def _window(self, body: dict[str, Any]) -> dict[str, Any]:
        step, rank = _int(body, "step"), _int(body, "rank")
        wait_s = min(_seconds(body, "wait_s"), MAX_POLL_S)
        window = self.producer.window(step, rank, wait_s=wait_s)
        if window is None:
            return {"step": step, "ready": False}
        return {"step": step, "ready": True, "micro_batches": window_to_json(window)}

    def _ack(self, body: dict[str, Any]) -> dict[str, Any]:
        self.producer.ack(_int(body, "step"), _int(body, "rank"))
        return {}

    def _resume(self, body: dict[str, Any]) -> dict[str, Any]:
        incarnation = body.get("incarnation")
        if not isinstance(incarnation, str) or not incarnation:
            raise ValueError("resume needs a non-empty 'incarnation' string")
        rolled = self.producer.resume(_int(body, "step"), _int(body, "rank"), incarnation)
        return {"rolled_back": rolled}


def _int(body: dict[str, Any], name: str) -> int:
    value = body.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"field {name!r} must be an integer, got {value!r}")
    return value


def _seconds(body: dict[str, Any], name: str) -> float:
    # NaN compares false with everything: a NaN wait made the producer's wait loop spin.
    value = body.get(name, 0.0)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"field {name!r} must be a finite number of seconds, got {value!r}")
    if value < 0:
        raise ValueError(f"field {name!r} must not be negative, got {value!r}")
    return float(value)
