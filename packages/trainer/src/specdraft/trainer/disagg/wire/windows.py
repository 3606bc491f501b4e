"""The window controller's contract, shared by the producer (server) and the trainer ranks
(client): routes, status codes, the long-poll cap and the address file.

Routes (JSON in and out, stdlib server, 127.0.0.1 unless configured; every route but /health
needs the run's secret, see `specdraft.trainer.runtime.run_secret`):
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

from ...runtime.private import private_dir, write_private

# A long poll never holds a request thread longer than this; the client polls again.
MAX_POLL_S = 10.0
# Status codes of a refused window request; the client turns each back into its meaning.
STATUS_BAD_REQUEST = 400
# The step was already trained (acknowledged), or was never delivered to this rank.
STATUS_CONFLICT = 409
# The step lies beyond the run's plan: the run has ended.
STATUS_OUT_OF_RANGE = 410
# The producer failed; the supervisor restarts it, so a client retries.
STATUS_PRODUCER_FAILED = 503

ADDRESS_NAME = "controller.json"


def controller_address_path(run_dir: str | Path) -> Path:
    """Where a run folder records the controller's URL."""
    return Path(run_dir) / "disagg" / ADDRESS_NAME


def write_controller_address(run_dir: str | Path, url: str) -> Path:
    """Record the controller URL atomically (a reader never sees half a file); 0600."""
    path = controller_address_path(run_dir)
    private_dir(path.parent)
    return write_private(path, json.dumps({"url": url, "pid": os.getpid()}).encode())


def read_controller_address(run_dir: str | Path) -> str | None:
    """The URL the current producer serves on, or None before one has started."""
    path = controller_address_path(run_dir)
    try:
        return str(json.loads(path.read_text(encoding="utf-8"))["url"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
