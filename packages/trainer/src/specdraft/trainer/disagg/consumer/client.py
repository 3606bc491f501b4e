"""The trainer side of window delivery: one `WindowClient` per trainer rank.

    client = WindowClient(rank=rank, run_dir=run_dir, timeout_s=dis.window_timeout_s)
    client.resume(start_step, incarnation=launch_id)   # only when restored from a checkpoint
    for step in range(start_step, client.plan()["total_steps"]):
        refs = client.next_window(step)               # [micro_step][sample] SampleRefs
        batches = fetch_micro_batches(store, refs)    # tensors for the collator
        ...train the accumulation window, optimizer step, maybe checkpoint...
        client.ack(step)

Every call carries the run's secret (given, or read from `<run_dir>/disagg/secret`, which the
producer creates). Every call retries through a producer restart (the supervisor restarts it
on a new port; the client re-reads the address from the run folder) until `timeout_s`, then
raises an error that names the step, the config field and the last thing the producer said.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from ...runtime.http_client import HttpFailure, call_json
from ...runtime.run_secret import read_run_secret
from ..wire.refs import WindowRefs, window_from_json
from ..wire.windows import (
    MAX_POLL_S,
    STATUS_OUT_OF_RANGE,
    STATUS_PRODUCER_FAILED,
    controller_address_path,
    read_controller_address,
)

# Pause between attempts while the producer is unreachable (restarting).
RETRY_PAUSE_S = 0.2


class WindowError(RuntimeError):
    """The producer refused a window request (its message says why)."""


class WindowTimeout(WindowError, TimeoutError):
    """No answer from the producer within deployment.disaggregated.window_timeout_s."""


class EndOfRun(WindowError):
    """The step is past the run's last optimizer step."""


def new_incarnation() -> str:
    """A fresh id for one trainer launch (rank 0 makes it and broadcasts it to the others)."""
    return uuid.uuid4().hex


class WindowClient:
    """Fetches whole optimizer windows for one rank and acknowledges them."""

    def __init__(
        self,
        *,
        rank: int,
        timeout_s: float,
        url: str | None = None,
        run_dir: str | Path | None = None,
        secret: str | None = None,
    ) -> None:
        if (url is None) == (run_dir is None):
            raise ValueError("give the controller's url or the run folder, not both")
        self.rank = rank
        self.timeout_s = timeout_s
        self._url = url.rstrip("/") if url else None
        self._run_dir = Path(run_dir) if run_dir is not None else None
        self.last_wait_s = 0.0
        self._secret = secret

    @classmethod
    def from_config(cls, cfg: Any, run_dir: str | Path, *, rank: int) -> WindowClient:
        """A client for a config's run folder with its window timeout."""
        return cls(
            rank=rank, timeout_s=cfg.deployment.disaggregated.window_timeout_s, run_dir=run_dir
        )

    @property
    def url(self) -> str | None:
        """The controller URL in use (read from the run folder when not fixed)."""
        if self._url is not None:
            return self._url
        assert self._run_dir is not None
        return read_controller_address(self._run_dir)

    @property
    def secret(self) -> str | None:
        """The run's secret: the one given, else the run folder's (once the producer made it)."""
        if self._secret is None and self._run_dir is not None:
            self._secret = read_run_secret(self._run_dir)
        return self._secret

    def plan(self) -> dict[str, Any]:
        """total_steps, windows_per_epoch, world_size and run of the producer's plan."""
        return self._call("GET", "/plan", None, what="the run plan")

    def next_window(self, step: int) -> WindowRefs:
        """This rank's micro-batches of `step`; blocks until published or the timeout."""
        started = time.monotonic()
        deadline = started + self.timeout_s
        while True:
            left = deadline - time.monotonic()
            payload = {"step": step, "rank": self.rank, "wait_s": max(0.0, min(left, MAX_POLL_S))}
            body = self._call(
                "POST", "/window", payload, what=f"the window of step {step}", deadline=deadline
            )
            if body.get("ready"):
                self.last_wait_s = time.monotonic() - started
                return window_from_json(body["micro_batches"])
            if time.monotonic() >= deadline:
                raise WindowTimeout(self._timeout_message(f"the window of step {step}", None))

    def ack(self, step: int) -> None:
        """Tell the producer this rank finished the optimizer step of `step`."""
        self._call("POST", "/ack", {"step": step, "rank": self.rank}, what=f"ack of step {step}")

    def resume(self, step: int, *, incarnation: str) -> list[int]:
        """After restoring the checkpoint taken after `step` steps: later windows come again.

        `incarnation` is one id shared by every rank of this trainer launch and new for each
        launch (`new_incarnation()` on rank 0, broadcast): the producer rolls back once per
        launch, so a slow rank's resume cannot undo a fast rank's first acknowledgements.
        """
        payload = {"step": step, "rank": self.rank, "incarnation": incarnation}
        body = self._call("POST", "/resume", payload, what=f"resume at step {step}")
        return list(body.get("rolled_back", []))

    def stats(self) -> dict[str, float]:
        """The producer's counters for the metrics log; {} if it cannot be reached now."""
        url = self.url
        if url is None:
            return {}
        try:
            body = call_json(
                "GET", f"{url}/stats", timeout=min(self.timeout_s, 5.0), secret=self.secret
            )
        except HttpFailure:
            return {}
        return {k: float(v) for k, v in body.items() if isinstance(v, (int, float))}

    def _call(
        self,
        method: str,
        path: str,
        payload: Any,
        *,
        what: str,
        deadline: float | None = None,
    ) -> Any:
        deadline = deadline if deadline is not None else time.monotonic() + self.timeout_s
        last_error: str | None = None
        while True:
            url = self.url
            left = deadline - time.monotonic()
            if url is not None:
                try:
                    # The server may hold a window request for MAX_POLL_S; allow for it.
                    return call_json(
                        method,
                        f"{url}{path}",
                        payload,
                        timeout=max(left, 0.1) + MAX_POLL_S,
                        secret=self.secret,
                    )
                except HttpFailure as exc:
                    last_error = str(exc)
                    if exc.kind == "status":
                        self._raise_refusal(exc, what)
            else:
                last_error = f"no producer has written {self._address_hint()} yet"
            if time.monotonic() >= deadline:
                raise WindowTimeout(self._timeout_message(what, last_error))
            time.sleep(min(RETRY_PAUSE_S, max(deadline - time.monotonic(), 0.0)))

    def _raise_refusal(self, exc: HttpFailure, what: str) -> None:
        # 503: the producer failed and is about to be restarted: keep trying until the deadline.
        if exc.status == STATUS_PRODUCER_FAILED:
            return
        if exc.status == STATUS_OUT_OF_RANGE:
            raise EndOfRun(f"rank {self.rank}: {what}: {exc}") from None
        raise WindowError(f"rank {self.rank}: {what} refused: {exc}") from None

    def _timeout_message(self, what: str, last_error: str | None) -> str:
        where = self.url or self._address_hint()
        last = f"; last error: {last_error}" if last_error else ""
        return (
            f"rank {self.rank}: no answer for {what} within {self.timeout_s:g} s "
            f"(deployment.disaggregated.window_timeout_s) from the producer at {where}{last}. "
            f"Check the producer's and capture servers' logs in the run folder, or raise the "
            f"timeout"
        )

    def _address_hint(self) -> str:
        if self._run_dir is None:
            return str(self._url)
        return str(controller_address_path(self._run_dir))
