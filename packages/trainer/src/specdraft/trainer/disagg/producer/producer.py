"""The producer: leases prompts to capture servers, publishes whole optimizer windows of
sample references, and turns trainer acknowledgements into store removals.

Threads: one dispatcher leases samples in step order (bounded by `max_inflight_captures` and
by the backpressure watermark); a pool of workers runs the captures; the controller's request
threads call `window`, `ack` and `resume`. All state lives in the ledger's `LedgerState` and
changes only through `_record` (append durably, then apply), under one condition variable.

Exactly-once, in short: a sample is trained when the window holding it is acknowledged by every
rank; acknowledged windows are never delivered again unless a trainer resumes from an older
checkpoint, which rolls every later trained window back to "not captured" (and makes later
untrained ones forget their acknowledgements); store keys carry the attempt, and an attempt
number is used once per sample for the whole run.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter, deque
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from specdraft.config import Config

from ..store.base import FeatureStore
from ..wire.capture import CaptureRequest, reply_to_json
from ..wire.keys import sample_key
from ..wire.refs import SampleRef, WindowRefs, window_from_json
from .backpressure import Backpressure, resolve_high_watermark
from .ledger import LEDGER_NAME, Ledger, LedgerError, StepState, read_ledger, replay
from .plan import RunPlan
from .pool import CapturePool
from .prompts import Prompt, count_reasons

log = logging.getLogger(__name__)

BASE_TENSORS = ("input_ids", "loss_mask", "hidden_states")

# Records a restarted producer can lose without harm: a lost capture is captured again (its
# lease, which is durable, keeps the attempt number unique), a lost publish is published again,
# a lost failure or removal is found again by the restart sweep. Everything a trainer can
# observe (acks, trained) is durable, and an fsync also makes every earlier record durable.
_LAZY_EVENTS = frozenset({"capture", "publish", "fail", "removed"})


class ProducerError(RuntimeError):
    """The producer stopped: its message says why and what to change."""


class StepOutOfRange(LookupError):
    """A step at or past the end of the run."""


class StepAlreadyTrained(RuntimeError):
    """A window every rank has acknowledged was asked for again without a resume."""


class StepNotDelivered(RuntimeError):
    """An acknowledgement for a window that was never published."""


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
        self._state = replay(read_ledger(self._ledger_path))
        self._ledger = Ledger(self._ledger_path)
        self._cond = threading.Condition(threading.RLock())
        self._stop = threading.Event()
        self._fatal: BaseException | None = None
        self._closed = False
        self._inflight: set[tuple[int, int]] = set()
        self._reserved: set[tuple[int, int]] = set()
        self._tries: Counter[tuple[int, int]] = Counter()
        self._latencies_ms: deque[float] = deque(maxlen=256)
        self._counters: Counter[str] = Counter()
        self._cursor = 0
        self.backpressure = Backpressure(settings.high_watermark, cond=self._cond)
        self._pool = CapturePool(
            clients,
            probe_timeout_s=min(settings.capture_timeout_s, settings.health_timeout_s),
            drop_after_s=settings.health_timeout_s,
            on_drop=self._record_drop,
            dropped=tuple(self._state.dropped_servers),
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
            self._closed = True
            self._ledger.close()

    def done(self) -> bool:
        """Whether every step of the run is acknowledged."""
        with self._cond:
            return self._advance_cursor() >= self.plan.total_steps

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the run is done (True), or the producer failed (raises), or timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                self._raise_if_failed()
                if self._advance_cursor() >= self.plan.total_steps:
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
        self._check_rank(rank)
        deadline = time.monotonic() + wait_s
        with self._cond:
            while True:
                self._raise_if_failed()
                self._check_step(step)
                if self._state.is_trained(step):
                    raise StepAlreadyTrained(
                        f"step {step} was acknowledged by every rank; a trainer restarted from a "
                        f"checkpoint must call resume(step) first"
                    )
                state = self._state.steps.get(step)
                if state is not None and state.published is not None:
                    return window_from_json(state.published[rank])
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    def ack(self, step: int, rank: int) -> None:
        """Rank `rank` finished the optimizer step of `step`; idempotent."""
        self._check_rank(rank)
        with self._cond:
            self._raise_if_failed()
            self._check_step(step)
            if self._state.is_trained(step):
                return
            state = self._state.steps.get(step)
            if state is None or not state.delivered:
                raise StepNotDelivered(f"ack for step {step}, which was never delivered")
            if rank in state.acks:
                return
            self._record("ack", **self._where(step), rank=rank)
            if len(state.acks) < self.settings.world_size:
                return
            self._record("trained", **self._where(step))
            pairs, slots = self._retire_step(step, state)
        self._remove(pairs, step=step)
        # Room is given back only once the objects are gone, so the store never holds more
        # than the watermark of samples.
        self.backpressure.release(slots)

    def resume(self, step: int, rank: int, incarnation: str) -> list[int]:
        """A trainer restored the checkpoint after `step` steps: re-deliver every later window.

        Windows before `step` count as trained whatever was acknowledged. From `step` on, a
        trained window (its objects were removed) goes back to "not captured" and is captured
        again (new attempts) before it is delivered again; an untrained one keeps its captures
        and forgets its acknowledgements. One rollback per trainer incarnation, so the second
        rank's call does not undo the first rank's fresh acknowledgements. Returns the steps
        whose acknowledgements were undone.
        """
        self._check_rank(rank)
        if not 0 <= step <= self.plan.total_steps:
            raise StepOutOfRange(f"resume step {step} is outside 0..{self.plan.total_steps}")
        with self._cond:
            self._raise_if_failed()
            if incarnation in self._state.incarnations:
                return []
            below: list[tuple[int, list[tuple[int, int]]]] = []
            above: list[tuple[int, int]] = []
            rolled = []
            slots = 0
            for index, state in sorted(self._state.steps.items()):
                if index < step and not state.trained:
                    pairs, n = self._retire_step(index, state)
                    below.append((index, pairs))
                    slots += n
                elif index >= step and state.trained:
                    rolled.append(index)
                    pairs, n = self._retire_step(index, state)
                    above += pairs
                    slots += n
                elif index >= step and state.acks:
                    rolled.append(index)  # its objects are still there: only the acks go
            self._record("resume", step=step, rank=rank, incarnation=incarnation, rolled=rolled)
            self._cursor = min(self._cursor, step)
            self._publish_ready()
        for index, pairs in below:
            self._remove(pairs, step=index)
        # Rolled-back attempts: nobody reads them again; the windows get new attempts.
        self._remove(above)
        self.backpressure.release(slots)
        log.info("trainer resumed at step %d (rank %d): rolled back %s", step, rank, rolled)
        return rolled

    def stats(self) -> dict[str, float]:
        """Counters for the trainer's metrics log (producer/*, store/*)."""
        with self._cond:
            lat = list(self._latencies_ms)
            trained = sum(1 for s in range(self.plan.total_steps) if self._state.is_trained(s))
            published = sum(1 for s in self._state.steps.values() if s.published is not None)
            out = {
                "producer/inflight": float(len(self._inflight)),
                "producer/outstanding": float(self.backpressure.outstanding),
                "producer/max_outstanding": float(self.backpressure.max_outstanding),
                "producer/high_watermark": float(self.settings.high_watermark),
                "producer/backpressure_ms": 1000.0 * self.backpressure.blocked_s,
                "producer/capture_latency_ms": sum(lat) / len(lat) if lat else 0.0,
                "producer/capture_latency_max_ms": max(lat) if lat else 0.0,
                "producer/captures": float(self._counters["captures"]),
                "producer/capture_failures": float(self._counters["failures"]),
                "producer/remove_errors": float(self._counters["remove_errors"]),
                "producer/published_steps": float(published),
                "producer/trained_steps": float(trained),
                "producer/total_steps": float(self.plan.total_steps),
                "producer/restarts": float(max(self._state.starts - 1, 0)),
                "producer/bad_prompts": float(len(self._state.bad_prompts)),
            }
            for reason, n in count_reasons(self._state.bad_prompts).items():
                out[f"producer/bad_prompts_{reason}"] = float(n)
        out.update(self._pool.stats())
        try:
            out["store/bytes_resident"] = float(self._store.bytes_resident())
        except Exception as exc:  # a counter must never take the producer down
            log.warning("store bytes_resident failed: %s", exc)
        return out

    # ------------------------------------------------------------------ restore

    def _restore(self, bad_prompts: dict[int, str]) -> None:
        state = self._state
        with self._cond:
            self._record(
                "start",
                pid=os.getpid(),
                total_steps=self.plan.total_steps,
                windows_per_epoch=self.plan.windows_per_epoch,
            )
            for epoch, digest in self.plan.digests.items():
                old = state.plan_digests.get(epoch)
                if old is None:
                    self._record("plan", epoch=epoch, digest=digest)
                elif old != digest:
                    raise LedgerError(
                        f"{self._ledger_path}: epoch {epoch} was planned differently by an "
                        f"earlier producer of this run (plan {old}, now {digest}): the data, "
                        f"seed or batch settings changed; restore them, or use a new output_dir"
                    )
            for sid, reason in bad_prompts.items():
                if sid not in state.bad_prompts:
                    self._record("bad_prompt", sample_id=sid, reason=reason)
            # Captured objects can be lost with their holder (a restarted Mooncake master):
            # what is gone is captured again.
            for index, step_state in state.steps.items():
                if step_state.trained:
                    continue
                for sid, slot in step_state.slots.items():
                    if slot.ref is not None and not self._objects_exist(slot.ref):
                        self._record(
                            "fail",
                            **self._where(index),
                            sample_id=sid,
                            attempt=slot.attempt,
                            server="",
                            error="objects missing from the feature store after a restart",
                        )
            for index, step_state in state.steps.items():
                if not step_state.trained:
                    self._reserved.update((index, sid) for sid in step_state.slots)
            self.backpressure.add(len(self._reserved))
            self._advance_cursor()
            self._publish_ready()
            unswept = {i: s for i, s in state.steps.items() if s.trained and not s.removed}
            swept = {(sid, slot.attempt) for s in unswept.values() for sid, slot in s.slots.items()}
            referenced = self._referenced_pairs() | swept
            orphans = sorted(p for p in state.live if p not in referenced)
        # Trained windows whose removal a dead producer did not finish, and attempts that no
        # live slot holds any more (leased by a dead producer, failed, or rolled back).
        for index, step_state in unswept.items():
            self._remove(
                [(sid, slot.attempt) for sid, slot in step_state.slots.items()], step=index
            )
        if orphans:
            self._remove(orphans)

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
                work = self._claim_work()
                if work is None:
                    continue
                step, sid = work
                try:
                    client = self._pool.acquire(timeout=self.settings.health_timeout_s)
                except BaseException:
                    with self._cond:
                        self._inflight.discard(work)
                    raise
                with self._cond:
                    if self._stop.is_set() or not self._needs_capture(step, sid):
                        self._inflight.discard(work)
                        self._pool.release(client, ok=True)
                        continue
                    attempt = self._state.next_attempt.get(sid, 0)
                    self._record(
                        "lease",
                        **self._where(step),
                        sample_id=sid,
                        attempt=attempt,
                        server=self._url(client),
                    )
                    self._tries[work] += 1
                self._executor.submit(self._capture, step, sid, attempt, client)
        except BaseException as exc:
            if not self._stop.is_set():
                self._fail(exc)

    def _claim_work(self) -> tuple[int, int] | None:
        """The next sample to lease, once a capture slot and (for a new one) room are free."""
        while not self._stop.is_set():
            with self._cond:
                self._raise_if_failed()
                work = None
                if len(self._inflight) < self.settings.max_inflight:
                    work = self._next_work()
                if work is not None and (
                    work in self._reserved
                    or self.backpressure.try_reserve(1, timeout=self.settings.window_timeout_s)
                ):
                    self._reserved.add(work)
                    self._inflight.add(work)
                    return work
                evicted = None if work is None else self._evict_after(work[0])
                if evicted is None:
                    self._cond.wait(0.5)
                    continue
            # Store removals outside the lock, as on an ack; the room is given back only once
            # the objects are gone, so the store never holds more than the watermark.
            index, pairs, slots = evicted
            self._remove(pairs)
            self.backpressure.release(slots)
            log.info(
                "step %d needs capturing and the watermark is full: evicted step %d (captured "
                "ahead; it is captured again later)",
                work[0],
                index,
            )
        return None

    def _evict_after(self, step: int) -> tuple[int, list[tuple[int, int]], int] | None:
        """Free the room of the last window captured ahead of `step`, if any can go.

        Leasing is in step order, so reservations normally form a prefix and the window the
        trainers need next never waits on room held by a later one. A resume breaks that: it
        rolls trained windows back to "not captured" while later windows, captured ahead, may
        hold the whole watermark; without this the rolled-back window would wait for room
        that only its own training frees. The latest such window goes back to "not captured"
        (its objects are removed) and is captured again once room frees. Windows with
        acknowledgements or captures in flight are left alone. Returns (step, pairs to
        remove, slots to release), or None when nothing can go.
        """
        busy = {index for index, _sid in self._inflight}
        for index in sorted(self._state.steps, reverse=True):
            if index <= step:
                return None
            state = self._state.steps[index]
            if state.trained or state.acks or index in busy:
                continue
            if not any((index, sid) in self._reserved for sid in state.slots):
                continue
            pairs, slots = self._retire_step(index, state)
            self._record("evict", **self._where(index))
            return index, pairs, slots
        return None

    def _next_work(self) -> tuple[int, int] | None:
        # In step order, so the window the trainers need next is always leased first and the
        # leased samples are a prefix: a window never waits on room taken by a later one
        # (after a resume, `_evict_after` restores that).
        for index, _state in self._open_windows():
            for sid in self.plan.windows[index].sample_ids():
                if (index, sid) not in self._inflight and self._needs_capture(index, sid):
                    return index, sid
        return None

    def _open_windows(self) -> Iterator[tuple[int, StepState | None]]:
        """In step order from the cursor: the steps neither trained nor published yet, with
        their ledger state (None before anything of theirs was recorded)."""
        for index in range(self._advance_cursor(), self.plan.total_steps):
            if self._state.is_trained(index):
                continue
            state = self._state.steps.get(index)
            if state is None or state.published is None:
                yield index, state

    def _needs_capture(self, step: int, sid: int) -> bool:
        if self._state.is_trained(step):
            return False
        state = self._state.steps.get(step)
        slot = None if state is None else state.slots.get(sid)
        return slot is None or slot.ref is None

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
            self._on_captured(step, sid, attempt, ref, 1000.0 * (time.perf_counter() - started))
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

    def _on_captured(self, step: int, sid: int, attempt: int, ref: SampleRef, ms: float) -> None:
        with self._cond:
            self._inflight.discard((step, sid))
            state = self._state.steps.get(step)
            slot = None if state is None else state.slots.get(sid)
            stale = self._closed or slot is None or slot.attempt != attempt
            stale = stale or self._state.is_trained(step)
            if not stale:
                self._record(
                    "capture",
                    **self._where(step),
                    sample_id=sid,
                    attempt=attempt,
                    ref=reply_to_json(ref),
                    latency_ms=round(ms, 3),
                )
                self._latencies_ms.append(ms)
                self._counters["captures"] += 1
                self._publish_ready()
            self._cond.notify_all()
        if stale:
            # Rolled back or trained while in flight: nobody will read these objects.
            self._remove([(sid, attempt)])

    def _on_failed(self, step: int, sid: int, attempt: int, client: Any, error: str) -> None:
        log.warning("capture of sample %d (attempt %d) failed: %s", sid, attempt, error)
        server_up = self._pool.report_failure(client, error)
        # The failed attempt may have written some of its objects: they are never read.
        self._remove([(sid, attempt)])
        with self._cond:
            self._inflight.discard((step, sid))
            self._counters["failures"] += 1
            if not self._closed:
                self._record(
                    "fail",
                    **self._where(step),
                    sample_id=sid,
                    attempt=attempt,
                    server=self._url(client),
                    error=error[:500],
                )
            # A server that went down is not the sample's fault: only failures on a healthy
            # server count against the sample's retries.
            if not server_up:
                self._tries[(step, sid)] -= 1
            if self._tries[(step, sid)] > self.settings.max_retries:
                self._fail(
                    ProducerError(
                        f"sample {sid} (step {step}) failed {self._tries[(step, sid)]} captures on "
                        f"healthy servers; last error from {self._url(client)}: {error}. Check the "
                        f"capture server's log, or raise "
                        f"deployment.disaggregated.capture_max_retries"
                    )
                )
            self._cond.notify_all()

    # ------------------------------------------------------------------ publish, ack

    def _publish_ready(self) -> None:
        """Publish, in step order, every window whose samples are all captured."""
        for index, state in self._open_windows():
            window = self.plan.windows[index]
            slots = {} if state is None else state.slots
            if any(sid not in slots or slots[sid].ref is None for sid in window.sample_ids()):
                return
            refs = [[[slots[sid].ref for sid in micro] for micro in rank] for rank in window.ranks]
            self._record("publish", **self._where(index), refs=refs)

    def _retire_step(self, index: int, state: StepState) -> tuple[list[tuple[int, int]], int]:
        """Drop a step's reservations: the (sample, attempt) pairs to remove and the room to
        give back once they are removed."""
        mine = {(index, sid) for sid in state.slots} & self._reserved
        # Out of the reserved set at once: a rolled-back sample must reserve anew.
        self._reserved -= mine
        # A rolled-back or evicted window starts its retry count afresh when leased again.
        for sid in state.slots:
            self._tries.pop((index, sid), None)
        sids = set(state.slots)
        pairs = {(sid, slot.attempt) for sid, slot in state.slots.items()}
        # Earlier attempts of the same samples (failed, or leased by a dead producer) go too,
        # unless another live window still holds them.
        referenced = self._referenced_pairs(exclude=index)
        pairs |= {p for p in self._state.live if p[0] in sids and p not in referenced}
        return sorted(pairs), len(mine)

    def _referenced_pairs(self, exclude: int | None = None) -> set[tuple[int, int]]:
        return {
            (sid, slot.attempt)
            for index, state in self._state.steps.items()
            if index != exclude and not state.trained
            for sid, slot in state.slots.items()
        }

    def _remove(self, pairs: list[tuple[int, int]], *, step: int | None = None) -> None:
        """Remove the objects of these attempts (force) and record it; store errors are kept."""
        removed = []
        for sid, attempt in pairs:
            try:
                for name in self.settings.tensor_names:
                    key = sample_key(self.settings.run, sid, attempt, name)
                    self._store.remove(key, force=True)
            except Exception as exc:  # removal is retried by the next producer's sweep
                log.warning("cannot remove sample %d attempt %d: %s", sid, attempt, exc)
                with self._cond:
                    self._counters["remove_errors"] += 1
                continue
            removed.append([sid, attempt])
        with self._cond:
            if self._closed or not (removed or step is not None):
                return
            fields: dict[str, Any] = {"objects": removed}
            if step is not None and len(removed) == len(pairs):
                fields["step"] = step
            self._record("removed", **fields)

    # ------------------------------------------------------------------ helpers

    def _record(self, ev: str, **fields: Any) -> None:
        """Append a record, then apply it: the only way state changes."""
        with self._cond:
            rec = self._ledger.append(ev, sync=ev not in _LAZY_EVENTS, **fields)
            self._state.apply(rec)
            self._cond.notify_all()

    def _record_drop(self, url: str, reason: str) -> None:
        log.warning("dropping capture server %s: %s", url, reason)
        with self._cond:
            if not self._closed:
                self._record("drop_server", server=url, reason=reason)

    def _where(self, step: int) -> dict[str, int]:
        window = self.plan.windows[step]
        return {"step": step, "epoch": window.epoch, "window": window.window}

    def _advance_cursor(self) -> int:
        while self._cursor < self.plan.total_steps and self._state.is_trained(self._cursor):
            self._cursor += 1
        return self._cursor

    def _check_step(self, step: int) -> None:
        if not 0 <= step < self.plan.total_steps:
            raise StepOutOfRange(
                f"step {step} is outside the run (0..{self.plan.total_steps - 1}): "
                f"the run has {self.plan.total_steps} optimizer steps"
            )

    def _check_rank(self, rank: int) -> None:
        if not 0 <= rank < self.settings.world_size:
            raise ValueError(f"rank {rank} is outside 0..{self.settings.world_size - 1}")

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
