"""The producer's exactly-once state machine: events in, ledger records and removals out.

No threads, no sockets, no files. The producer (`producer.py`) tells it what happened (it
restarted, a capture came back or failed, a trainer acknowledged or resumed, a store removal
finished, a capture server was dropped, it is stopping); the machine applies the ledger records
that follow to its `LedgerState` and leaves them in its outbox, and answers with what to do
next: a sample to lease (`Claim`), store objects to remove and room to give back (`Removal`), a
window captured ahead to evict (`Eviction`), or nothing (wait). The producer writes the outbox
to the ledger before it carries out anything the event asked for, under the one lock every
event runs under, so no trainer and no store sees an effect whose record is not written.

The rules: a sample is trained when the window holding it is acknowledged by every rank; an
acknowledged window is never delivered again unless a trainer resumes from an older checkpoint,
which rolls every later trained window back to "not captured" (and makes later untrained ones
forget their acknowledgements); store keys carry the attempt, and an attempt number is used
once per sample for the whole run; a sample holds room under the watermark from its lease
until its objects are removed, and only a window without acknowledgements or captures in flight
is ever evicted.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from .backpressure import Backpressure
from .ledger import LedgerError, LedgerState, StepState
from .plan import RunPlan

Pair = tuple[int, int]  # (sample_id, attempt): the objects of one capture attempt

# Records a restarted producer can lose without harm: a lost capture is captured again (its
# lease, which is durable, keeps the attempt number unique), a lost publish is published again,
# a lost failure or removal is found again by the restart sweep. Everything a trainer can
# observe (acks, trained) is durable, and an fsync also makes every earlier record durable.
LAZY_EVENTS = frozenset({"capture", "publish", "fail", "removed"})


class ProducerError(RuntimeError):
    """The producer stopped: its message says why and what to change."""


class StepOutOfRange(LookupError):
    """A step at or past the end of the run."""


class StepAlreadyTrained(RuntimeError):
    """A window every rank has acknowledged was asked for again without a resume."""


class StepNotDelivered(RuntimeError):
    """An acknowledgement for a window that was never published."""


@dataclass(frozen=True)
class Claim:
    """A sample to lease next: its room under the watermark and a capture slot are taken."""

    step: int
    sample_id: int


@dataclass(frozen=True)
class Removal:
    """Store objects to remove, then `slots` of room to give back.

    `step` names a retired window whose objects these are: once every pair is removed, the
    window is recorded as swept and a restarted producer does not sweep it again.
    """

    pairs: tuple[Pair, ...]
    step: int | None = None
    slots: int = 0


@dataclass(frozen=True)
class Eviction:
    """Window `step`, captured ahead, went back to "not captured" so `needed_by` gets room."""

    step: int
    needed_by: int
    removal: Removal


@dataclass(frozen=True)
class CapturedSlot:
    """A captured sample of a window not trained yet, as a restarted producer found it."""

    step: int
    sample_id: int
    attempt: int
    ref: dict[str, Any]


@dataclass(frozen=True)
class Failure:
    """What a failed capture leaves: its objects to remove, and the error that stops the run
    when the sample has failed too often on healthy servers."""

    removal: Removal
    fatal: ProducerError | None = None


def is_durable(record: dict[str, Any]) -> bool:
    """Whether the ledger must fsync this record before anything else happens."""
    return record["ev"] not in LAZY_EVENTS


class ProducerMachine:
    """The exactly-once bookkeeping of one producer over the run's plan and its ledger state.

    `state` is the replayed ledger (empty for a new run); every change to it goes through a
    record that lands in the outbox (`take_records`). Calls are not thread-safe: the producer
    makes them under its lock.
    """

    def __init__(
        self,
        plan: RunPlan,
        *,
        world_size: int,
        high_watermark: int,
        max_inflight: int,
        max_retries: int,
        window_timeout_s: float,
        state: LedgerState | None = None,
        ledger_name: str = "ledger",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.plan = plan
        self.world_size = world_size
        self.max_inflight = max_inflight
        self.max_retries = max_retries
        self.window_timeout_s = window_timeout_s
        self.state = state if state is not None else LedgerState()
        self.backpressure = Backpressure(high_watermark, clock=clock)
        self.closed = False
        self.counters: Counter[str] = Counter()
        self.latencies_ms: deque[float] = deque(maxlen=256)
        self._ledger_name = ledger_name
        self._outbox: list[dict[str, Any]] = []
        # Leased or about to be: at most max_inflight, never two captures of one slot at once.
        self._inflight: set[Pair] = set()
        # (step, sample) holding room under the watermark (given back once its objects go).
        self._reserved: set[Pair] = set()
        self._tries: Counter[Pair] = Counter()
        self._cursor = 0

    # ------------------------------------------------------------------ outbox

    def take_records(self) -> list[dict[str, Any]]:
        """The records applied since the last call, in order, for the ledger."""
        records, self._outbox = self._outbox, []
        return records

    def _record(self, ev: str, **fields: Any) -> None:
        """Apply a record and queue it for the ledger: the only way `state` changes."""
        if self.closed:
            raise ProducerError("the producer is stopping")
        rec = {"ev": ev, **fields}
        self.state.apply(rec)
        self._outbox.append(rec)

    # ------------------------------------------------------------------ restart

    def start(self, *, pid: int, bad_prompts: dict[int, str]) -> list[CapturedSlot]:
        """A producer (re)started over the ledger: record it, check the plan is the one the
        ledger was written for, and return the captured samples whose objects to look for."""
        self._record(
            "start",
            pid=pid,
            total_steps=self.plan.total_steps,
            windows_per_epoch=self.plan.windows_per_epoch,
        )
        for epoch, digest in self.plan.digests.items():
            old = self.state.plan_digests.get(epoch)
            if old is None:
                self._record("plan", epoch=epoch, digest=digest)
            elif old != digest:
                raise LedgerError(
                    f"{self._ledger_name}: epoch {epoch} was planned differently by an "
                    f"earlier producer of this run (plan {old}, now {digest}): the data, "
                    f"seed or batch settings changed; restore them, or use a new output_dir"
                )
        for sid, reason in bad_prompts.items():
            if sid not in self.state.bad_prompts:
                self._record("bad_prompt", sample_id=sid, reason=reason)
        return [
            CapturedSlot(index, sid, slot.attempt, slot.ref)
            for index, step_state in self.state.steps.items()
            if not step_state.trained
            for sid, slot in step_state.slots.items()
            if slot.ref is not None
        ]

    def restore(self, missing: Iterable[CapturedSlot]) -> list[Removal]:
        """Resume from the ledger once the store was checked: `missing` lost their objects
        (a restarted Mooncake master) and are captured again. Returns the sweep: trained
        windows whose removal a dead producer did not finish, and attempts no live slot holds
        any more (leased by a dead producer, failed, or rolled back)."""
        for slot in missing:
            self._record(
                "fail",
                **self._where(slot.step),
                sample_id=slot.sample_id,
                attempt=slot.attempt,
                server="",
                error="objects missing from the feature store after a restart",
            )
        for index, step_state in self.state.steps.items():
            if not step_state.trained:
                self._reserved.update((index, sid) for sid in step_state.slots)
        self.backpressure.add(len(self._reserved))
        self._advance_cursor()
        self._publish_ready()
        unswept = {i: s for i, s in self.state.steps.items() if s.trained and not s.removed}
        swept = {(sid, slot.attempt) for s in unswept.values() for sid, slot in s.slots.items()}
        referenced = self._referenced_pairs() | swept
        orphans = tuple(sorted(p for p in self.state.live if p not in referenced))
        removals = [
            Removal(tuple((sid, slot.attempt) for sid, slot in s.slots.items()), step=index)
            for index, s in unswept.items()
        ]
        if orphans:
            removals.append(Removal(orphans))
        return removals

    # ------------------------------------------------------------------ leasing

    def claim(self) -> Claim | Eviction | None:
        """The next sample to lease, once a capture slot and (for a new one) room are free;
        else a window captured ahead evicted for the one that needs room; else None (wait).

        Raises BackpressureTimeout when no room came free for `window_timeout_s`.
        """
        work = None
        if len(self._inflight) < self.max_inflight:
            work = self._next_work()
        if work is None:
            return None
        if work in self._reserved or self.backpressure.try_reserve(
            1, timeout=self.window_timeout_s
        ):
            self._reserved.add(work)
            self._inflight.add(work)
            return Claim(*work)
        return self._evict_after(work[0])

    def lease(self, claim: Claim, *, server: str) -> int | None:
        """A capture server was found for the claim: record the lease and return the attempt
        to capture under, or None when the sample no longer needs it (trained meanwhile)."""
        work = (claim.step, claim.sample_id)
        if not self._needs_capture(*work):
            self._inflight.discard(work)
            return None
        attempt = self.state.next_attempt.get(claim.sample_id, 0)
        self._record(
            "lease",
            **self._where(claim.step),
            sample_id=claim.sample_id,
            attempt=attempt,
            server=server,
        )
        self._tries[work] += 1
        return attempt

    def unclaim(self, claim: Claim) -> None:
        """The claim was not leased (no server, or stopping); its room stays reserved."""
        self._inflight.discard((claim.step, claim.sample_id))

    # ------------------------------------------------------------------ captures

    def captured(
        self, step: int, sid: int, attempt: int, ref: dict[str, Any], latency_ms: float
    ) -> Removal | None:
        """A capture's objects are in the store: record it and publish what became whole.
        Returns their removal instead when the window was rolled back or trained while the
        capture was in flight (nobody will read them)."""
        self._inflight.discard((step, sid))
        state = self.state.steps.get(step)
        slot = None if state is None else state.slots.get(sid)
        stale = self.closed or slot is None or slot.attempt != attempt
        if stale or self.state.is_trained(step):
            return Removal(((sid, attempt),))
        self._record(
            "capture",
            **self._where(step),
            sample_id=sid,
            attempt=attempt,
            ref=ref,
            latency_ms=round(latency_ms, 3),
        )
        self.latencies_ms.append(latency_ms)
        self.counters["captures"] += 1
        self._publish_ready()
        return None

    def capture_failed(
        self, step: int, sid: int, attempt: int, *, server: str, error: str, server_up: bool
    ) -> Failure:
        """A capture failed: the sample is leased again under a new attempt, and what the
        failed attempt may have written is removed. Only failures on a server that still
        passes its health probe count against the sample (a server that went down is not the
        sample's fault)."""
        work = (step, sid)
        self._inflight.discard(work)
        self.counters["failures"] += 1
        if not self.closed:
            self._record(
                "fail",
                **self._where(step),
                sample_id=sid,
                attempt=attempt,
                server=server,
                error=error[:500],
            )
        if not server_up:
            self._tries[work] -= 1
        fatal = None
        if self._tries[work] > self.max_retries:
            fatal = ProducerError(
                f"sample {sid} (step {step}) failed {self._tries[work]} captures on healthy "
                f"servers; last error from {server}: {error}. Check the capture server's log, "
                f"or raise deployment.disaggregated.capture_max_retries"
            )
        return Failure(Removal(((sid, attempt),)), fatal)

    def removed(self, removal: Removal, done: Iterable[Pair], *, errors: int = 0) -> None:
        """The producer removed `done` of the removal's pairs (`errors` failed: the next
        producer's sweep retries them); the removal's room is given back now, once the
        objects are gone, so the store never holds more than the watermark."""
        objects = [list(pair) for pair in done]
        self.counters["remove_errors"] += errors
        if not self.closed and (objects or removal.step is not None):
            fields: dict[str, Any] = {"objects": objects}
            if removal.step is not None and len(objects) == len(removal.pairs):
                fields["step"] = removal.step
            self._record("removed", **fields)
        if removal.slots:
            self.backpressure.release(removal.slots)

    def server_dropped(self, url: str, reason: str) -> None:
        """A capture server was dropped for good; a restarted producer does not use it."""
        if not self.closed:
            self._record("drop_server", server=url, reason=reason)

    def close(self) -> None:
        """The producer stops: later captures are stale and nothing more is recorded."""
        self.closed = True

    # ------------------------------------------------------------------ trainers

    def window_refs(self, step: int, rank: int) -> list[list[dict[str, Any]]] | None:
        """Rank `rank`'s published references of `step`, or None while it is not published."""
        self.check_rank(rank)
        self.check_step(step)
        if self.state.is_trained(step):
            raise StepAlreadyTrained(
                f"step {step} was acknowledged by every rank; a trainer restarted from a "
                f"checkpoint must call resume(step) first"
            )
        state = self.state.steps.get(step)
        if state is not None and state.published is not None:
            return state.published[rank]
        return None

    def acked(self, step: int, rank: int) -> Removal | None:
        """Rank `rank` finished the optimizer step of `step` (idempotent). The last rank's
        acknowledgement trains the window: its removal is returned."""
        self.check_rank(rank)
        self.check_step(step)
        if self.state.is_trained(step):
            return None
        state = self.state.steps.get(step)
        if state is None or not state.delivered:
            raise StepNotDelivered(f"ack for step {step}, which was never delivered")
        if rank in state.acks:
            return None
        self._record("ack", **self._where(step), rank=rank)
        if len(state.acks) < self.world_size:
            return None
        self._record("trained", **self._where(step))
        pairs, slots = self._retire_step(step, state)
        return Removal(pairs, step=step, slots=slots)

    def resumed(self, step: int, rank: int, incarnation: str) -> tuple[list[int], list[Removal]]:
        """A trainer launch restored the checkpoint after `step` steps. Returns the steps
        whose acknowledgements were undone, and the removals that follow.

        Windows before `step` count as trained whatever was acknowledged. From `step` on, a
        trained window (its objects were removed) goes back to "not captured" and is captured
        again (new attempts) before it is delivered again; an untrained one keeps its captures
        and forgets its acknowledgements. One rollback per trainer incarnation, so the second
        rank's call does not undo the first rank's fresh acknowledgements.
        """
        self.check_rank(rank)
        if not 0 <= step <= self.plan.total_steps:
            raise StepOutOfRange(f"resume step {step} is outside 0..{self.plan.total_steps}")
        if incarnation in self.state.incarnations:
            return [], []
        removals: list[Removal] = []
        above: tuple[Pair, ...] = ()
        above_slots = 0
        rolled = []
        for index, state in sorted(self.state.steps.items()):
            if index < step and not state.trained:
                pairs, n = self._retire_step(index, state)
                removals.append(Removal(pairs, step=index, slots=n))
            elif index >= step and state.trained:
                rolled.append(index)
                pairs, n = self._retire_step(index, state)
                above += pairs
                above_slots += n
            elif index >= step and state.acks:
                rolled.append(index)  # its objects are still there: only the acks go
        self._record("resume", step=step, rank=rank, incarnation=incarnation, rolled=rolled)
        self._cursor = min(self._cursor, step)
        self._publish_ready()
        # Rolled-back attempts: nobody reads them again; the windows get new attempts.
        removals.append(Removal(above, slots=above_slots))
        return rolled, removals

    # ------------------------------------------------------------------ queries

    def done(self) -> bool:
        """Whether every step of the run is trained."""
        return self._advance_cursor() >= self.plan.total_steps

    @property
    def inflight(self) -> int:
        """Samples claimed for capture and not back yet."""
        return len(self._inflight)

    def stats(self) -> dict[str, float]:
        """The machine's counters for the metrics log (producer/*)."""
        lat = list(self.latencies_ms)
        trained = sum(1 for s in range(self.plan.total_steps) if self.state.is_trained(s))
        published = sum(1 for s in self.state.steps.values() if s.published is not None)
        return {
            "producer/inflight": float(len(self._inflight)),
            "producer/outstanding": float(self.backpressure.outstanding),
            "producer/max_outstanding": float(self.backpressure.max_outstanding),
            "producer/high_watermark": float(self.backpressure.high_watermark),
            "producer/backpressure_ms": 1000.0 * self.backpressure.blocked_s,
            "producer/capture_latency_ms": sum(lat) / len(lat) if lat else 0.0,
            "producer/capture_latency_max_ms": max(lat) if lat else 0.0,
            "producer/captures": float(self.counters["captures"]),
            "producer/capture_failures": float(self.counters["failures"]),
            "producer/remove_errors": float(self.counters["remove_errors"]),
            "producer/published_steps": float(published),
            "producer/trained_steps": float(trained),
            "producer/total_steps": float(self.plan.total_steps),
            "producer/restarts": float(max(self.state.starts - 1, 0)),
            "producer/bad_prompts": float(len(self.state.bad_prompts)),
        }

    def check_step(self, step: int) -> None:
        """Refuse a step outside the run."""
        if not 0 <= step < self.plan.total_steps:
            raise StepOutOfRange(
                f"step {step} is outside the run (0..{self.plan.total_steps - 1}): "
                f"the run has {self.plan.total_steps} optimizer steps"
            )

    def check_rank(self, rank: int) -> None:
        """Refuse a rank outside the run's world."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside 0..{self.world_size - 1}")

    # ------------------------------------------------------------------ internals

    def _evict_after(self, step: int) -> Eviction | None:
        """Free the room of the last window captured ahead of `step`, if any can go.

        Leasing is in step order, so reservations normally form a prefix and the window the
        trainers need next never waits on room held by a later one. A resume breaks that: it
        rolls trained windows back to "not captured" while later windows, captured ahead, may
        hold the whole watermark; without this the rolled-back window would wait for room
        that only its own training frees. The latest such window goes back to "not captured"
        (its objects are removed) and is captured again once room frees. Windows with
        acknowledgements or captures in flight are left alone.
        """
        busy = {index for index, _sid in self._inflight}
        for index in sorted(self.state.steps, reverse=True):
            if index <= step:
                return None
            state = self.state.steps[index]
            if state.trained or state.acks or index in busy:
                continue
            if not any((index, sid) in self._reserved for sid in state.slots):
                continue
            pairs, slots = self._retire_step(index, state)
            self._record("evict", **self._where(index))
            return Eviction(index, step, Removal(pairs, slots=slots))
        return None

    def _next_work(self) -> Pair | None:
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
            if self.state.is_trained(index):
                continue
            state = self.state.steps.get(index)
            if state is None or state.published is None:
                yield index, state

    def _needs_capture(self, step: int, sid: int) -> bool:
        if self.state.is_trained(step):
            return False
        state = self.state.steps.get(step)
        slot = None if state is None else state.slots.get(sid)
        return slot is None or slot.ref is None

    def _publish_ready(self) -> None:
        """Publish, in step order, every window whose samples are all captured."""
        for index, state in self._open_windows():
            window = self.plan.windows[index]
            slots = {} if state is None else state.slots
            if any(sid not in slots or slots[sid].ref is None for sid in window.sample_ids()):
                return
            refs = [[[slots[sid].ref for sid in micro] for micro in rank] for rank in window.ranks]
            self._record("publish", **self._where(index), refs=refs)

    def _retire_step(self, index: int, state: StepState) -> tuple[tuple[Pair, ...], int]:
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
        pairs |= {p for p in self.state.live if p[0] in sids and p not in referenced}
        return tuple(sorted(pairs)), len(mine)

    def _referenced_pairs(self, exclude: int | None = None) -> set[Pair]:
        return {
            (sid, slot.attempt)
            for index, state in self.state.steps.items()
            if index != exclude and not state.trained
            for sid, slot in state.slots.items()
        }

    def _where(self, step: int) -> dict[str, int]:
        window = self.plan.windows[step]
        return {"step": step, "epoch": window.epoch, "window": window.window}

    def _advance_cursor(self) -> int:
        while self._cursor < self.plan.total_steps and self.state.is_trained(self._cursor):
            self._cursor += 1
        return self._cursor
