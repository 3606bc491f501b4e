"""`regenerate` keeps every finished answer when it stops mid-chunk (the pending file, the
finished rows in record order) and the endpoint's retry window and status line, without HTTP:
a fake responder fails part-way through a batch; the endpoint's shared outage state is driven
directly. The real server going away is tests/cli/test_regenerate_endpoint.py."""

from __future__ import annotations

import json
import time

import pytest

from specdraft.trainer.regenerate.endpoint import _Outage, format_duration
from specdraft.trainer.regenerate.output import PendingAnswers, pending_path
from specdraft.trainer.regenerate.replay import (
    ChatPrompt,
    RegenerateError,
    SourceRecord,
    regenerate,
)
from specdraft.trainer.runtime.http_client import HttpFailure


class FakeRenderer:
    """A prompt's length = characters of the conversation so far (no tokenizer)."""

    def __call__(self, messages, max_length):
        length = sum(len(m["content"]) + 1 for m in messages)
        return ChatPrompt(list(messages), [0] * length, max_length - length)


def _record(number, turns):
    messages = []
    for turn in range(turns):
        messages += [
            {"role": "user", "content": f"r{number} q{turn}"},
            {"role": "assistant", "content": "old"},
        ]
    return SourceRecord(f"r{number}", number, messages)


# Chunks of 3: (r0, r1, r2) and (r3, r4, r5), each answered in two rounds.
RECORDS = [_record(n, turns) for n, turns in enumerate([2, 1, 2, 2, 1, 2])]


class Target:
    """Answers with the question and the turns seen; `fail_at` = (call, indices): on that call
    only the prompts at `indices` are answered (through on_answer) before it fails."""

    def __init__(self, fail_at=None, error=RegenerateError):
        self.fail_at = fail_at
        self.error = error
        self.asked: list[str] = []
        self.calls = 0

    def describe(self):
        return {"kind": "fake"}

    @staticmethod
    def reply(prompt):
        return f"<{prompt.messages[-1]['content']} after {len(prompt.messages)}>"

    def answer(self, prompts, on_answer=None):
        self.calls += 1
        if self.fail_at and self.calls == self.fail_at[0]:
            for index in self.fail_at[1]:
                self.asked.append(prompts[index].messages[-1]["content"])
                on_answer(index, self.reply(prompts[index]))
            raise self.error("the server went away")
        self.asked += [p.messages[-1]["content"] for p in prompts]
        return [self.reply(p) for p in prompts]


def run(out, target):
    return regenerate(
        RECORDS,
        out,
        responder=target,
        render=FakeRenderer(),
        max_length=1000,
        settings={"test": 1},
        batch_size=3,
        progress=False,
    )


def rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.parametrize("error", [RegenerateError, KeyboardInterrupt])
def test_answers_finished_before_a_failure_are_kept_and_not_asked_again(tmp_path, error):
    whole = tmp_path / "whole.jsonl"
    run(whole, Target())

    # Call 4 is the second round of the second chunk: r3's and r5's second questions. r5's is
    # answered, r3's is not when the server goes away.
    out = tmp_path / "out.jsonl"
    with pytest.raises(error) as stopped:
        run(out, Target(fail_at=(4, [1]), error=error))
    # r3 is unfinished, so nothing of the second chunk can be written in record order ...
    assert [r["id"] for r in rows(out)] == ["r0", "r1", "r2"]
    # ... but its 4 finished answers (r3 q0, r4 q0, r5 q0, r5 q1) are kept.
    pending = PendingAnswers(pending_path(out), {})
    assert pending.open() == 4
    pending.close()
    if error is RegenerateError:
        result = stopped.value.result
        assert (result.written, result.answers_written, result.pending) == (3, 5, 4)
        assert "4 finished answer(s) of the unfinished batch" in result.describe_kept()

    target = Target()
    result = run(out, target)
    assert target.asked == ["r3 q1"]
    assert (result.written, result.already_done, result.answers, result.reused) == (3, 3, 1, 4)
    assert out.read_bytes() == whole.read_bytes()
    assert not pending_path(out).exists()


def test_the_finished_conversations_before_the_first_unfinished_one_are_written(tmp_path):
    whole = tmp_path / "whole.jsonl"
    run(whole, Target())
    # Call 4 (r3 q1, r5 q1): r3's is answered, r5's is not: r3 and r4 are finished rows.
    out = tmp_path / "out.jsonl"
    with pytest.raises(RegenerateError):
        run(out, Target(fail_at=(4, [0])))
    assert [r["id"] for r in rows(out)] == ["r0", "r1", "r2", "r3", "r4"]
    target = Target()
    run(out, target)
    assert target.asked == ["r5 q1"]
    assert out.read_bytes() == whole.read_bytes()


def test_pending_answers_survive_a_torn_line_and_never_match_other_settings(tmp_path):
    path = tmp_path / "out.jsonl.pending"
    pending = PendingAnswers(path, {"model": "a"})
    pending.open()
    key = pending.key(["question"])
    pending.add(key, "answer")
    pending.add(pending.key(["no text"]), None)
    pending.close()
    with open(path, "ab") as handle:
        handle.write(b'{"key": "abc", "ans')  # killed mid-write

    again = PendingAnswers(path, {"model": "a"})
    assert again.open() == 2
    assert again.get(key) == "answer" and again.get(again.key(["no text"])) is None
    again.close()
    assert path.read_bytes().endswith(b"}\n")

    other = PendingAnswers(path, {"model": "b"})
    other.open()
    assert other.key(["question"]) not in other
    other.close()


# --------------------------------------------------------------- the endpoint's retry window


def _outage(**kwargs):
    settings = {"retry_for_s": 10.0, "retries": 2, "base_s": 1.0, "cap_s": 4.0, **kwargs}
    return _Outage(**settings)


REFUSED = HttpFailure("unavailable", "POST x failed: [Errno 111] Connection refused")


def test_durations_read_as_the_status_line_says_them():
    assert [format_duration(s) for s in (0, 8.4, 59.6, 80, 600, 3900, 7200)] == [
        "0 s",
        "8 s",
        "1 min",
        "1 min 20 s",
        "10 min",
        "1 h 5 min",
        "2 h",
    ]


def test_each_request_gets_its_retries_then_the_window_bounds_the_outage():
    outage = _outage()
    # Before the server ever answered: its retries only (a wrong URL fails at once).
    delays = [outage.delay(attempt, REFUSED) for attempt in range(3)]
    assert 0.5 <= delays[0] <= 1 and 1 <= delays[1] <= 2 and delays[2] is None

    outage.answered_now()
    assert outage.since is None
    for attempt in range(2, 12):
        delay = outage.delay(attempt, REFUSED)
        assert 2 <= delay <= 4  # capped at 4 s, jittered down to half
    # Past the window (since the first failure after the last answer): give up.
    outage.since = time.monotonic() - 9.5
    assert outage.delay(20, REFUSED) <= 0.5  # the last retry lands at the window's end
    outage.since = time.monotonic() - 10.5
    assert outage.delay(20, REFUSED) is None
    # An answer starts the clock over.
    assert outage.answered_now() > 10
    assert outage.delay(20, REFUSED) is not None


def test_the_status_line_says_what_failed_when_it_retries_and_how_long_it_waited():
    outage = _outage(retry_for_s=600.0)
    outage.answered_now()
    assert outage.status() == ""
    outage.delay(0, REFUSED)
    now = time.monotonic()
    outage.since = now - 80
    outage.retry_at[1] = now + 7.5
    assert outage.status() == "server unreachable, retrying in 8 s (1 min 20 s of 10 min)"
    outage.delay(0, HttpFailure("status", "busy", 503))
    assert outage.status().startswith("server busy (503), retrying in")
