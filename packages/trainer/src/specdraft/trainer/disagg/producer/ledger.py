"""The producer's ledger: an append-only, fsync'd JSONL journal of every lease, capture,
publish, acknowledgement and resume, and the state it replays into.

The producer changes its state only by appending a record and applying it (event sourcing),
so a restarted producer that replays the file is in exactly the state the dead one had
written: acknowledged windows are never published again, captured objects still in the store
are reused, and what was lost is captured again under a fresh attempt key.

Steps are global optimizer steps: step = epoch * windows_per_epoch + window.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .jsonl import JsonlLineError, read_jsonl

LEDGER_NAME = "ledger.jsonl"


class LedgerError(RuntimeError):
    """The ledger file cannot be read or does not belong to this run."""


@dataclass
class SlotState:
    """One sample of one step: its latest leased attempt and, once captured, its reference."""

    attempt: int
    ref: dict[str, Any] | None = None


@dataclass
class StepState:
    """One optimizer window as the ledger knows it."""

    epoch: int
    window: int
    slots: dict[int, SlotState] = field(default_factory=dict)
    published: list[list[list[dict[str, Any]]]] | None = None
    acks: set[int] = field(default_factory=set)
    trained: bool = False
    removed: bool = False
    # Published at least once since the last rollback: acknowledgements are accepted.
    delivered: bool = False


@dataclass
class LedgerState:
    """Everything a producer needs to resume: built by applying the records in order."""

    plan_digests: dict[int, str] = field(default_factory=dict)
    steps: dict[int, StepState] = field(default_factory=dict)
    next_attempt: dict[int, int] = field(default_factory=dict)
    # (sample_id, attempt) pairs whose objects may still be in the store.
    live: set[tuple[int, int]] = field(default_factory=set)
    bad_prompts: dict[int, str] = field(default_factory=dict)
    dropped_servers: dict[str, str] = field(default_factory=dict)
    incarnations: set[str] = field(default_factory=set)
    # Steps below this are in the trainers' weights (set by a trainer resume).
    trained_below: int = 0
    starts: int = 0

    def step(self, step: int, *, epoch: int, window: int) -> StepState:
        """The state of a step, created on first use."""
        state = self.steps.get(step)
        if state is None:
            state = self.steps[step] = StepState(epoch=epoch, window=window)
        return state

    def apply(self, rec: dict[str, Any]) -> None:
        """Apply one record; the producer calls this after the record is on disk."""
        ev = rec["ev"]
        handler = getattr(self, f"_on_{ev}", None)
        if handler is None:
            raise LedgerError(f"unknown ledger event {ev!r}")
        handler(rec)

    # One handler per event: the whole state machine of the producer, in one place.

    def _on_start(self, rec: dict[str, Any]) -> None:
        self.starts += 1

    def _on_plan(self, rec: dict[str, Any]) -> None:
        self.plan_digests[rec["epoch"]] = rec["digest"]

    def _on_bad_prompt(self, rec: dict[str, Any]) -> None:
        self.bad_prompts[rec["sample_id"]] = rec["reason"]

    def _on_drop_server(self, rec: dict[str, Any]) -> None:
        self.dropped_servers[rec["server"]] = rec["reason"]

    def _on_lease(self, rec: dict[str, Any]) -> None:
        sid, attempt = rec["sample_id"], rec["attempt"]
        step = self.step(rec["step"], epoch=rec["epoch"], window=rec["window"])
        step.slots[sid] = SlotState(attempt=attempt)
        self.next_attempt[sid] = max(self.next_attempt.get(sid, 0), attempt + 1)
        self.live.add((sid, attempt))

    def _on_capture(self, rec: dict[str, Any]) -> None:
        slot = self._slot(rec)
        if slot is not None and slot.attempt == rec["attempt"]:
            slot.ref = rec["ref"]

    def _on_fail(self, rec: dict[str, Any]) -> None:
        slot = self._slot(rec)
        if slot is not None and slot.attempt == rec["attempt"]:
            slot.ref = None
            # A published window whose objects were lost is withdrawn until re-captured.
            self.steps[rec["step"]].published = None

    def _on_publish(self, rec: dict[str, Any]) -> None:
        step = self.step(rec["step"], epoch=rec["epoch"], window=rec["window"])
        step.published = rec["refs"]
        step.delivered = True

    def _on_ack(self, rec: dict[str, Any]) -> None:
        self.step(rec["step"], epoch=rec["epoch"], window=rec["window"]).acks.add(rec["rank"])

    def _on_trained(self, rec: dict[str, Any]) -> None:
        self.step(rec["step"], epoch=rec["epoch"], window=rec["window"]).trained = True

    def _on_removed(self, rec: dict[str, Any]) -> None:
        for sid, attempt in rec["objects"]:
            self.live.discard((sid, attempt))
        if "step" in rec:
            self.steps[rec["step"]].removed = True

    def _on_resume(self, rec: dict[str, Any]) -> None:
        # A trainer restored the checkpoint taken after `step` optimizer steps: every earlier
        # window is in its weights, no later one is, whatever was acknowledged before. A later
        # window that was trained had its objects removed: it goes back to "not captured" (its
        # attempts stay in `live` until removed) and is captured again in step order under the
        # watermark. A later window not yet trained still has its objects: it keeps its
        # captures (and its publication) and only forgets its acknowledgements, so a fresh
        # launch (resume at step 0) does not throw away what the producer captured ahead.
        resume_step = rec["step"]
        self.incarnations.add(rec["incarnation"])
        for index, state in self.steps.items():
            if index < resume_step:
                state.trained = True
            elif state.trained:
                state.slots.clear()
                state.published = None
                state.acks.clear()
                state.trained = state.removed = state.delivered = False
            else:
                state.acks.clear()
        self.trained_below = resume_step

    def _on_evict(self, rec: dict[str, Any]) -> None:
        # The producer gave a window captured ahead its room back, for an earlier window that
        # needs capturing (one rolled back by a resume): it goes back to "not captured" and is
        # captured again, in step order, when room frees. Its attempts stay in `live` until
        # removed. Never a window with acknowledgements (the trainers are past it).
        state = self.steps[rec["step"]]
        state.slots.clear()
        state.published = None
        state.delivered = False

    def _slot(self, rec: dict[str, Any]) -> SlotState | None:
        step = self.steps.get(rec["step"])
        return None if step is None else step.slots.get(rec["sample_id"])

    def is_trained(self, step: int) -> bool:
        """Whether the trainers' weights hold this step (acknowledged, or below a resume)."""
        state = self.steps.get(step)
        if state is not None:
            return state.trained
        return step < self.trained_below


class Ledger:
    """Append-only JSONL journal.

    A durable append (the default) is flushed and fsync'd before it returns, with every record
    written before it. `sync=False` only flushes: for records a restarted producer can do
    without (a lost capture is captured again, a lost publish published again), so they ride
    on the next durable append instead of paying an fsync each.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _drop_torn_tail(self.path)
        self._lock = threading.Lock()
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - held open

    def append(self, ev: str, *, sync: bool = True, **fields: Any) -> dict[str, Any]:
        """Write one record (durably unless sync=False) and return it."""
        rec = {"ev": ev, "t": round(time.time(), 3), **fields}
        line = json.dumps(rec, separators=(",", ":")) + "\n"
        with self._lock:
            self._file.write(line)
            self._file.flush()
            if sync:
                os.fsync(self._file.fileno())
        return rec

    def close(self) -> None:
        """Close the file (appends after this fail)."""
        with self._lock:
            self._file.close()


def _drop_torn_tail(path: Path) -> None:
    """Cut a last line that a killed producer left half-written, so appends start clean."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with open(path, "r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)


def read_ledger(path: str | Path) -> list[dict[str, Any]]:
    """All complete records of a ledger file ([] when it does not exist yet)."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    try:
        # A torn last line is a killed writer's record that never made it to disk whole.
        lines = read_jsonl(path, torn_tail_ok=True)
    except JsonlLineError as exc:
        raise LedgerError(
            f"{path}:{exc.lineno}: corrupt ledger record ({exc.reason}); the run folder's ledger "
            f"was edited or damaged: restore it, or start a new run folder"
        ) from exc
    for lineno, rec in lines:
        if not isinstance(rec, dict) or "ev" not in rec:
            raise LedgerError(f"{path}:{lineno}: not a ledger record: {json.dumps(rec)[:80]!r}")
        records.append(rec)
    return records


def replay(records: list[dict[str, Any]]) -> LedgerState:
    """The state a producer had after writing these records."""
    state = LedgerState()
    for rec in records:
        state.apply(rec)
    return state


def trained_sample_counts(state: LedgerState) -> dict[int, Counter[int]]:
    """How many times each sample is in the trained windows, per epoch (exactly-once audit)."""
    counts: dict[int, Counter[int]] = {}
    for state_step in state.steps.values():
        if not state_step.trained:
            continue
        epoch_counts = counts.setdefault(state_step.epoch, Counter())
        if state_step.published is not None:
            for rank in state_step.published:
                for micro in rank:
                    epoch_counts.update(ref["sample_id"] for ref in micro)
        elif state_step.delivered:
            # Delivered, then withdrawn because a restarted producer found objects missing,
            # and acknowledged before it was published again: the trainers had read it whole,
            # and its slots name the window's samples.
            epoch_counts.update(list(state_step.slots))
    return {epoch: c for epoch, c in counts.items() if c}
