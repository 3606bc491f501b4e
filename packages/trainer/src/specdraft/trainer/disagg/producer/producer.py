"""The producer: leases prompts to capture servers, publishes whole optimizer windows of
sample references, and turns trainer acknowledgements into store removals.

This is the machinery around `machine.ProducerMachine`, which holds every exactly-once rule:
one dispatcher thread leases samples in step order (the machine says which, or that a window
captured ahead must be evicted, or to wait); a pool of workers runs the captures; the
controller's request threads call `window`, `ack` and `resume`. Each event goes to the machine
under one condition variable; the records it applied are written to the ledger (durably unless
a restart can do without them) before anything it asked for is carried out: store removals
(outside the lock), then the room they held given back.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from specdraft.config import Config

from ..store.base import FeatureStore
from ..wire.capture import CaptureRequest, reply_to_json
from ..wire.keys import sample_key
from ..wire.refs import SampleRef, WindowRefs, window_from_json
from .backpressure import resolve_high_watermark
from .ledger import LEDGER_NAME, Ledger, read_ledger, replay
from .machine import Claim, Eviction, ProducerError, ProducerMachine, Removal, is_durable
from .plan import RunPlan
from .pool import CapturePool
from .prompts import Prompt, count_reasons

log = logging.getLogger(__name__)
T = TypeVar("T")

BASE_TENSORS = ("input_ids", "loss_mask", "hidden_states")


@dataclass(frozen=True)
class ProducerSettings:
    """The producer's knobs, taken from the config once."""

    run: str
    world_size: int
    high_watermark: int
    max_inflight: int
    max_retries: int
    capture_timeout_s: float
    window_timeout_s: float
    health_timeout_s: float
    tensor_names: tuple[str, ...]

    @classmethod
    def from_config(cls, cfg: Config, plan: RunPlan | None = None) -> ProducerSettings:
        """Settings of a config's disaggregated section (the watermark sized to `plan`'s
        largest window when given: packed windows hold more samples than rows)."""
        from ...models.family import family_of

        dis = cfg.deployment.disaggregated
        extra = family_of(cfg).extra_feature_keys
        largest = largest_window(plan) if plan is not None else None
        return cls(
            run=cfg.run_id,
            world_size=cfg.deployment.world_size,
            high_watermark=resolve_high_watermark(cfg, largest),
            max_inflight=dis.max_inflight_captures,
            max_retries=dis.capture_max_retries,
            capture_timeout_s=dis.capture_timeout_s,
            window_timeout_s=dis.window_timeout_s,
            health_timeout_s=dis.health_timeout_s,
            tensor_names=BASE_TENSORS + extra,
        )


def largest_window(plan: RunPlan) -> int:
    """The most samples one window of the plan holds (0 for an empty plan)."""
    return max((len(window.sample_ids()) for window in plan.windows), default=0)


def ledger_path(run_dir: str | Path) -> Path:
    """Where a run folder keeps the producer's ledger."""
    return Path(run_dir) / "disagg" / LEDGER_NAME


class Producer:
    """Captures the run's windows and serves them to the trainer ranks."""

    def __init__(
        self,
        settings: ProducerSettings,
        plan: RunPlan,
        prompts: Sequence[Prompt],
        store: FeatureStore,
        clients: Sequence[Any],
        run_dir: str | Path,
        *,
        bad_prompts: dict[int, str] | None = None,
    ) -> None:
        largest = largest_window(plan)
        if settings.high_watermark < largest:
            # A window is captured whole before it is published: a watermark below it would
            # hold the producer forever (packed windows hold more samples than rows).
            log.warning(
                "high watermark %d is below the largest window (%d samples): raised to it",
                settings.high_watermark,
                largest,
            )
            settings = replace(settings, high_watermark=largest)
        self.settings = settings
        self.plan = plan
        self._prompts = {p.sample_id: p for p in prompts}
        missing = [sid for w in plan.windows for sid in w.sample_ids() if sid not in self._prompts]
        if missing:
            raise ValueError(f"the plan names samples with no prompt: {missing[:5]}")
        self._store = store
        self._ledger_path = ledger_path(run_dir)
        self.machine = ProducerMachine(
            plan,
            world_size=settings.world_size,
            high_watermark=settings.high_watermark,
            max_inflight=settings.max_inflight,
            max_retries=settings.max_retries,
            window_timeout_s=settings.window_timeout_s,
            state=replay(read_ledger(self._ledger_path)),
            ledger_name=str(self._ledger_path),
        )
        self._ledger = Ledger(self._ledger_path)
        self._cond = threading.Condition(threading.RLock())
        self._stop = threading.Event()
        self._fatal: BaseException | None = None
        self._pool = CapturePool(
            clients,
            probe_timeout_s=min(settings.capture_timeout_s, settings.health_timeout_s),
            drop_after_s=settings.health_timeout_s,
            on_drop=self._record_drop,
            dropped=tuple(self.machine.state.dropped_servers),
        )
        self._executor = ThreadPoolExecutor(settings.max_inflight, thread_name_prefix="capture")
        self._dispatcher = threading.Thread(
            target=self._dispatch_loop, name="producer-dispatch", daemon=True
        )
        self._restore(bad_prompts or {})

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> Producer:
        """Start leasing; returns self."""
        self._pool.start()
        self._dispatcher.start()
        return self

    def stop(self) -> None:
        """Stop leasing and close the ledger; captures in flight are abandoned."""
        self._stop.set()
        self._pool.stop()
        with self._cond:
            self._cond.notify_all()
        if self._dispatcher.is_alive():
            self._dispatcher.join(timeout=self.settings.capture_timeout_s)
        self._executor.shutdown(wait=False, cancel_futures=True)
        with self._cond:
            self.machine.close()
            self._ledger.close()

    def done(self) -> bool:
        """Whether every step of the run is acknowledged."""
        with self._cond:
            return self.machine.done()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the run is done (True), or the producer failed (raises), or timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                self._raise_if_failed()
                if self.machine.done():
                    return True
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(0.5 if left is None else min(left, 0.5))

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped the producer, if any."""
        return self._fatal

    # ------------------------------------------------------------------ trainer side

    def plan_info(self) -> dict[str, Any]:
        """What a trainer needs to iterate the run."""
        return {
            "run": self.settings.run,
            "total_steps": self.plan.total_steps,
            "windows_per_epoch": self.plan.windows_per_epoch,
            "world_size": self.settings.world_size,
            # Checkpoints record it: a resumed trainer must see the same plan (same data).
            "data": self.plan.digests.get(0, ""),
        }

    def window(self, step: int, rank: int, *, wait_s: float) -> WindowRefs | None:
        """Rank `rank`'s micro-batches of step `step`, waiting up to wait_s; None if not yet."""
        self.machine.check_rank(rank)
        deadline = time.monotonic() + wait_s
        with self._cond:
            while True:
                self._raise_if_failed()
                refs = self.machine.window_refs(step, rank)
                if refs is not None:
                    return window_from_json(refs)
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    def ack(self, step: int, rank: int) -> None:
        """Rank `rank` finished the optimizer step of `step`; idempotent."""
        with self._cond:
            self._raise_if_failed()
            removal = self._event(self.machine.acked, step, rank)
        if removal is not None:
            self._remove(removal)

    def resume(self, step: int, rank: int, incarnation: str) -> list[int]:
        """A trainer restored the checkpoint after `step` steps: re-deliver every later window
        (`ProducerMachine.resumed`). Returns the steps whose acknowledgements were undone."""
        with self._cond:
            self._raise_if_failed()
            rolled, removals = self._event(self.machine.resumed, step, rank, incarnation)
        if removals:
            for removal in removals:
                self._remove(removal)
            log.info("trainer resumed at step %d (rank %d): rolled back %s", step, rank, rolled)
        return rolled

    def stats(self) -> dict[str, float]:
        """Counters for the trainer's metrics log (producer/*, store/*)."""
        with self._cond:
            out = self.machine.stats()
            for reason, n in count_reasons(self.machine.state.bad_prompts).items():
                out[f"producer/bad_prompts_{reason}"] = float(n)
        out.update(self._pool.stats())
        try:
            out["store/bytes_resident"] = float(self._store.bytes_resident())
        except Exception as exc:  # a counter must never take the producer down
            log.warning("store bytes_resident failed: %s", exc)
        return out

    # ------------------------------------------------------------------ restore

    def _restore(self, bad_prompts: dict[int, str]) -> None:
        with self._cond:
            captured = self._event(self.machine.start, pid=os.getpid(), bad_prompts=bad_prompts)
            # Captured objects can be lost with their holder (a restarted Mooncake master):
            # what is gone is captured again.
            missing = [slot for slot in captured if not self._objects_exist(slot.ref)]
            sweep = self._event(self.machine.restore, missing)
        for removal in sweep:
            self._remove(removal)

    def _objects_exist(self, ref: dict[str, Any]) -> bool:
        try:
            return all(self._store.exists(t["key"]) for t in ref["tensors"])
        except Exception as exc:
            log.warning("cannot check sample %s in the store: %s", ref.get("sample_id"), exc)
            return False

    # ------------------------------------------------------------------ dispatch

    def _dispatch_loop(self) -> None:
        try:
            while not self._stop.is_set():
                claim = self._claim_work()
                if claim is None:
                    continue
                try:
                    client = self._pool.acquire(timeout=self.settings.health_timeout_s)
                except BaseException:
                    with self._cond:
                        self.machine.unclaim(claim)
                    raise
                with self._cond:
                    attempt = None
                    if self._stop.is_set():
                        self.machine.unclaim(claim)
                    else:
                        attempt = self._event(self.machine.lease, claim, server=self._url(client))
                if attempt is None:
                    self._pool.release(client, ok=True)
                    continue
                self._executor.submit(self._capture, claim.step, claim.sample_id, attempt, client)
        except BaseException as exc:
            if not self._stop.is_set():
                self._fail(exc)

    def _claim_work(self) -> Claim | None:
        """The next sample to lease, once a capture slot and (for a new one) room are free."""
        while not self._stop.is_set():
            with self._cond:
                self._raise_if_failed()
                decision = self._event(self.machine.claim)
                if isinstance(decision, Claim):
                    return decision
                if decision is None:
                    self._cond.wait(0.5)
                    continue
            self._evict(decision)
        return None

    def _evict(self, eviction: Eviction) -> None:
        # Store removals outside the lock, as on an ack; the room is given back only once the
        # objects are gone, so the store never holds more than the watermark.
        self._remove(eviction.removal)
        log.info(
            "step %d needs capturing and the watermark is full: evicted step %d (captured "
            "ahead; it is captured again later)",
            eviction.needed_by,
            eviction.step,
        )

    # ------------------------------------------------------------------ capture

    def _capture(self, step: int, sid: int, attempt: int, client: Any) -> None:
        try:
            prompt = self._prompts[sid]
            request = CaptureRequest(
                run=self.settings.run,
                sample_id=sid,
                attempt=attempt,
                input_ids=list(prompt.input_ids),
                loss_mask=list(prompt.loss_mask),
            )
            started = time.perf_counter()
            try:
                reply = client.capture(request, timeout=self.settings.capture_timeout_s)
                ref = self._checked_ref(reply, request)
            except Exception as exc:  # any capture failure is retried under a new attempt
                self._pool.release(client, ok=False)
                self._on_failed(step, sid, attempt, client, f"{type(exc).__name__}: {exc}")
                return
            self._pool.release(client, ok=True)
            ms = 1000.0 * (time.perf_counter() - started)
            with self._cond:
                stale = self._event(
                    self.machine.captured, step, sid, attempt, reply_to_json(ref), ms
                )
            if stale is not None:
                # Rolled back or trained while in flight: nobody will read these objects.
                self._remove(stale)
        except BaseException as exc:
            self._fail(exc)

    def _checked_ref(self, reply: Any, request: CaptureRequest) -> SampleRef:
        ref: SampleRef = reply
        if (ref.run, ref.sample_id, ref.attempt) != (
            request.run,
            request.sample_id,
            request.attempt,
        ):
            raise ValueError(
                f"reply is for {ref.run}/{ref.sample_id}/g{ref.attempt}, asked for "
                f"{request.run}/{request.sample_id}/g{request.attempt}"
            )
        if ref.seq_len != len(request.input_ids):
            raise ValueError(f"reply seq_len {ref.seq_len} != {len(request.input_ids)} tokens")
        names = {t.name for t in ref.tensors}
        missing = [n for n in self.settings.tensor_names if n not in names]
        if missing:
            raise ValueError(f"reply lacks tensors {missing}")
        return ref

    def _on_failed(self, step: int, sid: int, attempt: int, client: Any, error: str) -> None:
        log.warning("capture of sample %d (attempt %d) failed: %s", sid, attempt, error)
        server_up = self._pool.report_failure(client, error)
        with self._cond:
            failure = self._event(
                self.machine.capture_failed,
                step,
                sid,
                attempt,
                server=self._url(client),
                error=error,
                server_up=server_up,
            )
            if failure.fatal is not None:
                self._fail(failure.fatal)
        # The failed attempt may have written some of its objects: they are never read.
        self._remove(failure.removal)

    # ------------------------------------------------------------------ store, ledger

    def _remove(self, removal: Removal) -> None:
        """Remove the objects of the removal's attempts (force), then tell the machine; store
        errors are counted and left to the next producer's sweep."""
        done, errors = [], 0
        for sid, attempt in removal.pairs:
            try:
                for name in self.settings.tensor_names:
                    self._store.remove(
                        sample_key(self.settings.run, sid, attempt, name), force=True
                    )
            except Exception as exc:  # removal is retried by the next producer's sweep
                log.warning("cannot remove sample %d attempt %d: %s", sid, attempt, exc)
                errors += 1
                continue
            done.append((sid, attempt))
        with self._cond:
            self._event(self.machine.removed, removal, done, errors=errors)

    def _event(self, handler: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one machine event under the lock and write the records it applied before the
        caller carries out anything it asked for (even when it raised after recording)."""
        with self._cond:
            try:
                return handler(*args, **kwargs)
            finally:
                self._commit()

    def _commit(self) -> None:
        """Write the machine's new records to the ledger, in order, and wake the waiters. A
        record the ledger could not take leaves the machine ahead of its file: that stops the
        producer (a restarted one replays the file)."""
        try:
            for rec in self.machine.take_records():
                fields = {k: v for k, v in rec.items() if k != "ev"}
                self._ledger.append(rec["ev"], sync=is_durable(rec), **fields)
        except BaseException as exc:
            self._fail(exc)
            raise
        finally:
            self._cond.notify_all()

    def _record_drop(self, url: str, reason: str) -> None:
        log.warning("dropping capture server %s: %s", url, reason)
        with self._cond:
            self._event(self.machine.server_dropped, url, reason)

    def _raise_if_failed(self) -> None:
        if self._fatal is not None:
            raise ProducerError(f"the producer stopped: {self._fatal}") from self._fatal
        if self._stop.is_set():
            raise ProducerError("the producer is stopping")

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            if self._fatal is None:
                log.error("producer failed: %s", exc)
                self._fatal = exc
            self._cond.notify_all()

    @staticmethod
    def _url(client: Any) -> str:
        return str(getattr(client, "url", repr(client)))
