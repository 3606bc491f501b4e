"""The producer's exactly-once state machine on its own: no threads, no sockets, no files.

`World` drives a `ProducerMachine` by hand the way the producer does (claim, lease, a capture
landing or failing, a removal carried out later), with trainer ranks that fetch windows, train,
checkpoint, acknowledge, crash and resume, a producer that crashes (losing its captures in
flight, its pending removals and, on a machine crash, the unsynced tail of its ledger) and
restarts from the ledger, and a store master that loses its objects. The unit tests pin single
rules; the property test runs any interleaving of all of it and checks exactly once.
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from specdraft.trainer.disagg.producer.ledger import (
    LedgerError,
    LedgerState,
    replay,
    trained_sample_counts,
)
from specdraft.trainer.disagg.producer.machine import (
    Claim,
    Eviction,
    ProducerMachine,
    Removal,
    StepAlreadyTrained,
    StepNotDelivered,
    StepOutOfRange,
    is_durable,
)
from specdraft.trainer.disagg.producer.plan import RunPlan, plan_run

Pair = tuple[int, int]


def make_plan(
    n: int = 8, *, world: int = 2, micro: int = 1, accum: int = 1, epochs: int = 2
) -> RunPlan:
    """n samples (ids 100, 103, ...) shuffled per epoch, cut into windows of world*micro*accum."""
    ids = [100 + 3 * i for i in range(n)]
    per_step = world * micro
    steps = (n // per_step) // accum * accum

    def planner(epoch: int) -> list[list[list[int]]]:
        order = list(range(n))
        random.Random(epoch).shuffle(order)
        return [
            [order[(s * world + r) * micro : (s * world + r + 1) * micro] for s in range(steps)]
            for r in range(world)
        ]

    return plan_run(
        planner, ids, num_epochs=epochs, max_steps=None, grad_accum_steps=accum, world_size=world
    )


def ref(sid: int, attempt: int) -> dict[str, Any]:
    """A capture reply as the ledger stores it (the machine reads only the sample id)."""
    return {"sample_id": sid, "attempt": attempt, "tensors": [{"key": f"r/{sid}/g{attempt}/x"}]}


def ref_pairs(state: LedgerState, step: int) -> list[Pair]:
    """The (sample, attempt) pairs a step's publication points trainers at."""
    published = state.steps[step].published or []
    return [(r["sample_id"], r["attempt"]) for rank in published for micro in rank for r in micro]


class World:
    """A machine with a model store, captures in flight, pending removals and trainer ranks."""

    def __init__(
        self, plan: RunPlan, *, world: int, watermark: int, max_inflight: int, retries: int = 10**6
    ) -> None:
        self.plan, self.world = plan, world
        self.watermark, self.max_inflight, self.retries = watermark, max_inflight, retries
        self.journal: list[dict[str, Any]] = []  # the ledger file
        self.store: set[Pair] = set()
        self.flight: list[tuple[int, int, int]] = []  # (step, sample, attempt) being captured
        self.pending: list[Removal] = []  # removals the producer has yet to carry out
        self.weights: list[tuple[int, list[int]]] = []  # what the trainers trained, in order
        self.checkpoint = 0  # steps in the last checkpoint
        self.acks: list[tuple[int, int]] = []  # (step, rank) acknowledgements not sent yet
        self.launch = 0
        self.lossy = False  # a ledger tail was lost since the trainers' last launch
        self.boot()
        self.trainer_launch()

    # -------------------------------------------------------------- producer side

    def call(self, handler: Any, *args: Any, **kwargs: Any) -> Any:
        """One event, its records written to the ledger (even when it raised)."""
        try:
            return handler(*args, **kwargs)
        finally:
            self.journal += self.machine.take_records()

    def queue(self, removals: list[Removal]) -> None:
        """Removals for the producer to carry out later (an empty one asks for nothing)."""
        self.pending += [r for r in removals if r.pairs or r.slots or r.step is not None]

    def boot(self) -> None:
        """A producer (re)starts: replay the ledger, check the store, sweep."""
        self.machine = ProducerMachine(
            self.plan,
            world_size=self.world,
            high_watermark=self.watermark,
            max_inflight=self.max_inflight,
            max_retries=self.retries,
            window_timeout_s=30.0,
            state=replay(self.journal),
            clock=lambda: 0.0,
        )
        captured = self.call(self.machine.start, pid=len(self.journal), bad_prompts={})
        missing = [c for c in captured if (c.sample_id, c.attempt) not in self.store]
        self.queue(self.call(self.machine.restore, missing))

    def claim(self) -> bool:
        """The dispatcher's turn: lease the next sample, or evict; False when told to wait."""
        decision = self.call(self.machine.claim)
        if isinstance(decision, Eviction):
            self.pending.append(decision.removal)
        elif isinstance(decision, Claim):
            attempt = self.call(self.machine.lease, decision, server="s")
            if attempt is not None:
                self.flight.append((decision.step, decision.sample_id, attempt))
        return decision is not None

    def land(self, i: int, *, ok: bool = True, server_up: bool = True) -> None:
        """Capture i comes back: its objects are in the store (a failure wrote some too)."""
        step, sid, attempt = self.flight.pop(i % len(self.flight))
        self.store.add((sid, attempt))
        if ok:
            stale = self.call(self.machine.captured, step, sid, attempt, ref(sid, attempt), 1.0)
            if stale is not None:
                self.pending.append(stale)
            return
        failure = self.call(
            self.machine.capture_failed,
            step,
            sid,
            attempt,
            server="s",
            error="boom",
            server_up=server_up,
        )
        assert failure.fatal is None
        self.pending.append(failure.removal)

    def remove(self, i: int) -> None:
        """The producer carries out pending removal i."""
        removal = self.pending.pop(i % len(self.pending))
        self.store -= set(removal.pairs)
        self.call(self.machine.removed, removal, removal.pairs)

    def capture_ahead(self) -> None:
        """Lease until told to wait, then every capture lands (removals stay pending)."""
        while self.claim():
            pass
        while self.flight:
            self.land(0)

    def fill(self) -> None:
        """The producer runs on alone until it must wait: every capture lands, every removal
        is carried out, leasing goes on up to the watermark."""
        while self.flight or self.pending or self.claim():
            while self.flight:
                self.land(0)
            while self.pending:
                self.remove(0)

    def producer_crash(self, *, landed: int, cut: int | None) -> None:
        """The producer dies: captures in flight finish writing (bit i of `landed`) or not,
        pending removals are lost, and with `cut` the ledger loses part of its tail after the
        last fsync'd record (a machine crash)."""
        for i, (_step, sid, attempt) in enumerate(self.flight):
            if landed >> i & 1:
                self.store.add((sid, attempt))
        self.flight, self.pending = [], []
        if cut is not None:
            last = max((i for i, r in enumerate(self.journal) if is_durable(r)), default=-1)
            keep = last + 1 + cut % (len(self.journal) - last)
            if keep < len(self.journal):
                self.lossy = True
            del self.journal[keep:]
        self.boot()

    def master_restart(self, *, lost: int) -> None:
        """The store's master restarts: objects are lost (bit i of `lost`), the producer with it."""
        for i, pair in enumerate(sorted(self.store)):
            if lost >> i & 1:
                self.store.discard(pair)
        self.producer_crash(landed=0, cut=None)

    # -------------------------------------------------------------- trainer side

    @property
    def next_step(self) -> int:
        return len(self.weights)

    def train(self) -> bool:
        """Every rank fetches the next window, trains it and queues its acknowledgement."""
        step = self.next_step
        if step >= self.plan.total_steps or any(s < step - 1 for s, _r in self.acks):
            return False
        refs = [self.machine.window_refs(step, rank) for rank in range(self.world)]
        if refs[0] is None:
            assert all(r is None for r in refs)
            return False
        pairs = [(r["sample_id"], r["attempt"]) for rank in refs for micro in rank for r in micro]
        missing = [p for p in pairs if p not in self.store]
        assert not missing, f"step {step} points at removed objects {missing}"
        self.weights.append((step, [sid for sid, _attempt in pairs]))
        self.acks += [(step, rank) for rank in range(self.world)]
        return True

    def ack(self, i: int) -> None:
        """Acknowledgement i reaches the producer."""
        step, rank = self.acks.pop(i % len(self.acks))
        try:
            removal = self.call(self.machine.acked, step, rank)
        except StepNotDelivered:
            # Only after a lost ledger tail took the window's publish with it: the trainer
            # stops on the error and is relaunched from its checkpoint.
            assert self.lossy, f"step {step} was delivered but its ack was refused"
            self.trainer_crash()
            return
        if removal is not None:
            self.pending.append(removal)

    def ack_all(self) -> None:
        """Every queued acknowledgement reaches the producer, in order."""
        while self.acks:
            self.ack(0)

    def save(self) -> None:
        """The ranks save a checkpoint after their last optimizer step."""
        self.checkpoint = self.next_step

    def trainer_crash(self) -> None:
        """Every rank dies; the relaunch restores the checkpoint and resumes each rank."""
        del self.weights[self.checkpoint :]
        self.acks = []
        self.trainer_launch()

    def trainer_launch(self) -> None:
        self.launch += 1
        self.lossy = False
        for rank in range(self.world):
            _rolled, removals = self.call(
                self.machine.resumed, self.checkpoint, rank, f"launch-{self.launch}"
            )
            self.queue(removals)

    # -------------------------------------------------------------- checks

    def check(self) -> None:
        """What holds between any two events."""
        state = self.machine.state
        assert self.machine.backpressure.outstanding <= self.watermark
        doomed = {pair for removal in self.pending for pair in removal.pairs}
        for step, step_state in state.steps.items():
            if step_state.published is None or state.is_trained(step):
                continue
            for pair in ref_pairs(state, step):
                # A window the trainers may still read keeps its objects: no retire, eviction
                # or sweep drops an unacknowledged sample.
                assert pair in self.store and pair not in doomed, (step, pair)

    def finish(self, limit: int = 10_000) -> None:
        """No more faults: run every component until the run is done."""
        for _ in range(limit):
            if self.machine.done() and not (self.flight or self.pending or self.acks):
                return
            progressed = False
            while self.flight:
                self.land(0)
                progressed = True
            while self.pending:
                self.remove(0)
                progressed = True
            progressed |= bool(self.acks)
            self.ack_all()
            while self.claim():
                progressed = True
            progressed |= self.train()
            self.check()
            assert progressed or self.flight, f"stuck at step {self.next_step}: {self.stats()}"
        pytest.fail(f"the run did not finish: {self.stats()}")

    def stats(self) -> dict[str, float]:
        return self.machine.stats()

    def check_done(self) -> None:
        """Exactly once, in the trainers' weights and in the ledger, and nothing left behind."""
        plan = self.plan
        assert [step for step, _ids in self.weights] == list(range(plan.total_steps))
        for step, ids in self.weights:
            assert ids == plan.windows[step].sample_ids()
        per_epoch: dict[int, Counter[int]] = {}
        for step, ids in self.weights:
            per_epoch.setdefault(plan.windows[step].epoch, Counter()).update(ids)
        once: dict[int, Counter[int]] = {}
        for window in plan.windows:
            once.setdefault(window.epoch, Counter()).update(window.sample_ids())
        assert per_epoch == once
        assert trained_sample_counts(replay(self.journal)) == once
        # The ledger alone gives the live state: a restart now would continue from here.
        assert replay(self.journal) == self.machine.state
        assert self.store == set() and self.machine.backpressure.outstanding == 0
        check_journal(self.journal)


def check_journal(journal: list[dict[str, Any]]) -> None:
    """Replayed record by record: a window is never published while a publication of it is
    live, and only a window without acknowledgements is ever evicted."""
    state = LedgerState()
    for rec in journal:
        step = state.steps.get(rec.get("step", -1))
        if rec["ev"] == "publish":
            assert step is None or step.published is None, f"step {rec['step']} published twice"
        if rec["ev"] == "evict":
            assert not step.acks and not step.trained, f"step {rec['step']} evicted with acks"
        state.apply(rec)


def world_of(
    *, n: int = 8, world: int = 2, micro: int = 1, accum: int = 1, epochs: int = 2, **kw: Any
) -> World:
    """A World over make_plan's plan of this geometry."""
    return World(
        make_plan(n, world=world, micro=micro, accum=accum, epochs=epochs), world=world, **kw
    )


# ----------------------------------------------------------------- single rules


def test_a_window_is_published_once_all_its_samples_are_captured_in_step_order():
    w = world_of(watermark=4, max_inflight=4)
    for _ in range(4):
        assert w.claim()
    assert [s for s, _sid, _a in w.flight] == [0, 0, 1, 1]
    assert not w.claim()  # the watermark (two windows) is full: wait
    w.land(3)  # step 1's second sample first
    w.land(2)
    # Step 1 is whole, but windows go out in step order: it waits for step 0.
    assert w.machine.window_refs(1, 0) is None
    w.land(0)
    assert w.machine.window_refs(0, 0) is None
    w.land(0)
    assert w.machine.window_refs(1, 0) is not None
    assert [r["ev"] for r in w.journal if r["ev"] == "publish"] == ["publish", "publish"]
    assert w.machine.window_refs(0, 1)[0][0]["sample_id"] == w.plan.windows[0].ranks[1][0][0]


def test_the_last_ranks_ack_trains_the_window_and_its_room_comes_back_after_removal():
    w = world_of(watermark=2, max_inflight=2)
    w.claim(), w.claim()
    w.land(0), w.land(0)
    assert w.train()
    assert w.machine.backpressure.outstanding == 2 and not w.claim()
    w.ack(0)
    assert not w.pending and not w.machine.state.is_trained(0)
    w.ack(0)
    (removal,) = w.pending
    assert removal.step == 0 and removal.slots == 2 and len(removal.pairs) == 2
    assert w.machine.backpressure.outstanding == 2  # still in the store
    w.remove(0)
    assert w.machine.backpressure.outstanding == 0 and w.store == set()
    assert w.journal[-1] == {
        "ev": "removed",
        "objects": [list(p) for p in removal.pairs],
        "step": 0,
    }
    assert w.machine.state.steps[0].removed
    assert w.call(w.machine.acked, 0, 1) is None  # idempotent once trained
    with pytest.raises(StepAlreadyTrained, match="must call resume"):
        w.machine.window_refs(0, 0)


def test_acks_and_windows_outside_the_run_or_before_delivery_are_refused():
    w = world_of(watermark=2, max_inflight=2)
    with pytest.raises(StepNotDelivered, match="never delivered"):
        w.machine.acked(0, 0)
    with pytest.raises(StepOutOfRange, match="outside the run"):
        w.machine.window_refs(w.plan.total_steps, 0)
    with pytest.raises(ValueError, match=r"rank 2 is outside 0\.\.1"):
        w.machine.acked(0, 2)
    with pytest.raises(StepOutOfRange, match="resume step"):
        w.machine.resumed(w.plan.total_steps + 1, 0, "x")
    assert w.journal[-1]["ev"] == "resume"  # nothing recorded by the refusals


def test_a_resume_rolls_trained_windows_back_and_keeps_untrained_captures():
    w = world_of(watermark=8, max_inflight=8)
    w.capture_ahead()
    for _ in range(3):
        assert w.train()
        w.ack_all()
    while w.pending:
        w.remove(0)
    assert w.train()  # step 3 trained, acknowledged by rank 0 only
    w.ack(0)
    w.checkpoint = 1
    w.trainer_crash()
    resume = [r for r in w.journal if r["ev"] == "resume"][-1]
    assert resume["step"] == 1 and resume["rolled"] == [1, 2, 3]
    state = w.machine.state
    assert state.is_trained(0) and not state.is_trained(1)
    assert not state.steps[1].slots and state.steps[1].published is None  # captured anew
    assert state.steps[3].published is not None and not state.steps[3].acks  # kept
    # The rolled-back windows' old attempts go; the second rank's resume changed nothing.
    assert {p for r in w.pending for p in r.pairs} == {
        (sid, 0) for step in (1, 2) for sid in w.plan.windows[step].sample_ids()
    }
    assert len([r for r in w.journal if r["ev"] == "resume"]) == 2  # one per launch
    w.finish()
    w.check_done()


def test_a_full_watermark_after_a_resume_evicts_the_last_window_captured_ahead():
    w = world_of(watermark=4, max_inflight=4)
    w.capture_ahead()
    assert w.train()
    w.ack_all()
    while w.pending:
        w.remove(0)
    while w.claim():
        pass
    while w.flight:
        w.land(0)  # steps 1 and 2 captured ahead: the watermark is full
    w.trainer_crash()  # from checkpoint 0: step 0 must be captured again
    while w.pending:
        w.remove(0)
    assert w.machine.backpressure.outstanding == 4
    assert w.claim()  # no room for step 0: step 2 goes
    evict = w.journal[-1]
    assert evict["ev"] == "evict" and evict["step"] == 2
    assert w.machine.state.steps[2].published is None
    w.finish()
    w.check_done()


def test_a_capture_back_after_its_window_was_trained_is_removed_unrecorded():
    w = world_of(watermark=2, max_inflight=2)
    w.claim(), w.claim()  # step 0 in flight
    # A trainer launch restored a checkpoint after step 1: step 0 is in its weights.
    w.call(w.machine.resumed, 1, 0, "restored-elsewhere")
    records = len(w.journal)
    step, sid, attempt = w.flight[0]
    w.land(0)
    assert len(w.journal) == records  # nothing recorded
    assert w.pending[-1] == Removal(((sid, attempt),))  # and nobody reads it: it goes
    assert w.machine.state.is_trained(step)


def test_failures_count_only_on_healthy_servers_and_too_many_stop_the_run():
    w = world_of(watermark=2, max_inflight=1, retries=1)
    w.claim()
    step, sid, _ = w.flight[0]
    w.land(0, ok=False, server_up=False)  # the server went down: not the sample's fault
    w.claim()
    w.land(0, ok=False)
    w.claim()
    assert w.flight[0][2] == 2  # a new attempt each time
    failure = w.call(w.machine.capture_failed, step, sid, 2, server="s9", error="bad", server_up=1)
    assert failure.fatal is not None
    message = str(failure.fatal)
    assert f"sample {sid}" in message and "s9" in message and "capture_max_retries" in message
    assert failure.removal.pairs == ((sid, 2),)


def test_a_restart_recaptures_lost_objects_and_sweeps_what_a_dead_producer_left():
    w = world_of(watermark=4, max_inflight=4)
    w.capture_ahead()
    assert w.train()
    w.ack(0), w.ack(0)  # step 0 trained; its removal dies with the producer
    lost = sorted(w.plan.windows[1].sample_ids())[0]
    w.store.discard((lost, 0))
    w.producer_crash(landed=0, cut=None)
    state = w.machine.state
    assert state.starts == 2 and state.steps[1].published is None
    fail = [r for r in w.journal if r["ev"] == "fail"][-1]
    assert (fail["sample_id"], fail["attempt"]) == (lost, 0) and "after a restart" in fail["error"]
    swept = [r for r in w.pending if r.step == 0]
    assert len(swept) == 1 and set(swept[0].pairs) == {
        (sid, 0) for sid in w.plan.windows[0].sample_ids()
    }
    assert w.machine.backpressure.outstanding == 2  # step 1's room, restored
    w.finish()
    w.check_done()


def test_a_ledger_of_another_plan_is_refused_with_the_file_and_the_fix():
    w = world_of(watermark=2, max_inflight=2)
    other = make_plan(epochs=2, n=10)
    machine = ProducerMachine(
        other,
        world_size=2,
        high_watermark=2,
        max_inflight=2,
        max_retries=1,
        window_timeout_s=1.0,
        state=replay(w.journal),
        ledger_name="run/disagg/ledger.jsonl",
    )
    with pytest.raises(LedgerError, match=r"ledger.jsonl: epoch 0 was planned differently.*"):
        machine.start(pid=1, bad_prompts={})


def test_only_records_a_restart_can_do_without_skip_the_fsync():
    lazy = {ev for ev in ("capture", "publish", "fail", "removed") if not is_durable({"ev": ev})}
    durable = {"start", "plan", "lease", "ack", "trained", "resume", "evict", "drop_server"}
    assert lazy == {"capture", "publish", "fail", "removed"}
    assert all(is_durable({"ev": ev}) for ev in durable)


def test_nothing_is_recorded_once_the_producer_stops():
    w = world_of(watermark=2, max_inflight=2)
    w.claim()
    step, sid, attempt = w.flight[0]
    w.machine.close()
    records = len(w.journal)
    stale = w.call(w.machine.captured, step, sid, attempt, ref(sid, attempt), 1.0)
    assert stale == Removal(((sid, attempt),))
    w.call(w.machine.removed, stale, stale.pairs)
    w.call(w.machine.server_dropped, "s", "gone")
    assert len(w.journal) == records


# ----------------------------------------------------------------- any interleaving

ACTIONS = st.tuples(
    st.sampled_from(
        ["claim"] * 4
        + ["land"] * 4
        + ["remove"] * 3
        + ["train"] * 3
        + ["ack"] * 3
        + ["fail", "save", "trainer_crash", "trainer_crash", "fill", "fill"]
        + ["producer_crash", "machine_crash", "machine_crash", "master_restart"]
    ),
    st.integers(0, 255),
    st.booleans(),
)


@settings(max_examples=400, deadline=None)
@given(
    actions=st.lists(ACTIONS, min_size=10, max_size=120),
    geometry=st.sampled_from([(1, 1, 1), (2, 1, 1), (2, 2, 1), (2, 1, 2), (1, 2, 2)]),
    n=st.integers(4, 12),
    epochs=st.integers(1, 2),
    windows=st.integers(1, 3),
    max_inflight=st.integers(1, 4),
)
def test_any_interleaving_of_acks_crashes_and_resumes_trains_each_sample_once_per_epoch(
    actions, geometry, n, epochs, windows, max_inflight
):
    """Whatever order captures land, fail and get removed in, whatever the trainers ack,
    checkpoint and crash from, and however often the producer, the machine it runs on or the
    store's master die: trainers never get a window whose objects are gone, the watermark
    holds, no window is published twice or evicted with acks, and the finished run trained
    each sample exactly once per epoch, as its ledger says, with nothing left in the store."""
    world, micro, accum = geometry
    window = world * micro * accum
    if n < window * accum:
        n = window * accum
    w = world_of(
        n=n,
        world=world,
        micro=micro,
        accum=accum,
        epochs=epochs,
        watermark=window * windows,
        max_inflight=max_inflight,
    )
    for kind, param, flag in actions:
        if kind == "claim":
            w.claim()
        elif kind in ("land", "fail") and w.flight:
            w.land(param, ok=kind == "land", server_up=flag)
        elif kind == "remove" and w.pending:
            w.remove(param)
        elif kind == "train":
            if w.train() and flag:  # and every rank acknowledges at once
                w.ack_all()
        elif kind == "ack" and w.acks:
            w.ack(param)
        elif kind == "save" and not w.acks:
            w.save()
        elif kind == "fill":
            w.fill()
        elif kind == "trainer_crash":
            w.trainer_crash()
        elif kind == "producer_crash":
            w.producer_crash(landed=param, cut=None)
        elif kind == "machine_crash":
            w.producer_crash(landed=param if flag else 0, cut=param)
        elif kind == "master_restart":
            w.master_restart(lost=param)
        w.check()
    lossy = w.lossy
    w.finish()
    w.check_done()
    # What the example exercised (`pytest --hypothesis-show-statistics` shows the shares).
    evs = Counter(r["ev"] for r in w.journal)
    for ev in ("evict", "resume", "fail", "start"):
        event(f"{ev} records: {min(evs[ev], 3)}{'+' if evs[ev] >= 3 else ''}")
    event(f"lost ledger tail: {lossy}")
