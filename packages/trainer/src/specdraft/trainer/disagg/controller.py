"""The window controller: the producer's HTTP face towards the trainer ranks.

Routes (JSON in and out, stdlib server, 127.0.0.1 unless configured):
  GET  /health                          {"status": "ok" | "failed", "done": bool}
  GET  /plan                            total_steps, windows_per_epoch, world_size, run
  GET  /stats                           the producer's counters (producer/*, store/*)
  POST /window {step, rank, wait_s}     200 {"step", "micro_batches"} | 204-like {"ready": false}
  POST /ack    {step, rank}             200 {}
  POST /resume {step, rank, incarnation} 200 {"rolled_back": [...]}
A window request is a long poll: it waits up to `wait_s` (capped) for the window to be
published, so the trainer learns of it at once without hammering the producer.

The producer writes the controller's address to `<run_dir>/disagg/controller.json`, so trainer
ranks find it again after the supervisor restarts the producer on another port.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from .http_json import JsonServer, JsonService
from .producer import (
    Producer,
    ProducerError,
    StepAlreadyTrained,
    StepNotDelivered,
    StepOutOfRange,
)
from .refs import window_to_json

# A long poll never holds a request thread longer than this; the client polls again.
MAX_POLL_S = 10.0

ADDRESS_NAME = "controller.json"


def controller_address_path(run_dir: str | Path) -> Path:
    """Where a run folder records the controller's URL."""
    return Path(run_dir) / "disagg" / ADDRESS_NAME


def write_controller_address(run_dir: str | Path, url: str) -> Path:
    """Record the controller URL atomically (a reader never sees half a file)."""
    path = controller_address_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"url": url, "pid": os.getpid()}), encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_controller_address(run_dir: str | Path) -> str | None:
    """The URL the current producer serves on, or None before one has started."""
    path = controller_address_path(run_dir)
    try:
        return str(json.loads(path.read_text(encoding="utf-8"))["url"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


# Producer exceptions -> HTTP status; the client turns them back into the same meaning.
_STATUS = (
    (StepOutOfRange, 410),
    (StepAlreadyTrained, 409),
    (StepNotDelivered, 409),
    (ProducerError, 503),
    (ValueError, 400),
    (LookupError, 400),
)


class WindowController(JsonService):
    """Serves a producer's windows over HTTP; `start()` runs it on a background thread."""

    def __init__(self, producer: Producer, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.producer = producer
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
        wait_s = min(float(body.get("wait_s", 0.0)), MAX_POLL_S)
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
