"""`specdraft regenerate`: rewrite a corpus's assistant turns with the target's own greedy answers.

A drafter learns to predict its target, so it is trained on what the target says, not on what
another model said in the original corpus. Each selected conversation is replayed turn by turn:
every assistant turn is replaced by the target's greedy answer to the conversation so far (the
earlier turns already regenerated), from the target in-process or from an OpenAI-compatible
chat endpoint (an SGLang server).

The output is ShareGPT JSONL (`id`, `source_row`, `conversations` with from/value turns) that the
data pipeline reads. Runs resume: rows already in the output (keyed by source id and row) are
skipped, and records are generated in fixed chunks of `batch_size`, so a resumed run writes the
same bytes as one uninterrupted run. A run stopped inside a chunk (its server gone for good,
Ctrl-C) writes the chunk's finished conversations up to the first unfinished one, and keeps
every other finished answer of the chunk in the pending file, where the next run finds them.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, Protocol

from ..data.bad_rows import NO_ASSISTANT_TURN, BadRow
from ..data.chat_template import ChatTemplate, render_chat
from ..data.conversations import normalise_conversation
from ..data.sharegpt import SHAREGPT_SPEC, iter_json_array, sharegpt_package_file
from ..data.sources import check_source, read_source
from .output import PendingAnswers, RegeneratedFile, pending_path

# Chat roles back to the ShareGPT speaker names the data pipeline reads.
SHAREGPT_SPEAKERS = {"user": "human", "assistant": "gpt", "system": "system", "tool": "tool"}
# A conversation whose prompt leaves fewer free positions than this under data.max_length
# stops there: training truncates at max_length, so a later answer would never be seen.
MIN_ANSWER_TOKENS = 2
PROMPT_TOO_LONG = "prompt_too_long"
# The generator gave no text for a turn (e.g. an endpoint's `content: null`): the conversation
# is not written, and counted under this reason.
BAD_ANSWER = "bad_answer"


class RegenerateError(RuntimeError):
    """Regeneration cannot go on (unusable source, endpoint failure, mismatched output file).

    `result` is what the run had done when it stopped (set when it stopped while generating);
    `resumable` says that rerunning the same command is the remedy (a server that went away),
    not something to fix first.
    """

    result: RegenerateResult | None = None
    resumable: bool = False


@dataclass(frozen=True)
class ChatPrompt:
    """A conversation so far, as messages and as the token ids the chat template renders.

    `max_new_tokens` is what is left under data.max_length: training truncates there, so a
    longer answer would only be cut off again.
    """

    messages: list[dict[str, str]]
    token_ids: list[int]
    max_new_tokens: int


# Called with a prompt's index in the batch and its answer as soon as that answer is finished.
AnswerCallback = Callable[[int, "str | None"], None]


class Responder(Protocol):
    """Greedy answers of the target to a batch of prompts (order kept).

    A responder may also have a `show_status` attribute: `regenerate` sets it to a callable
    that shows a short line on the progress bar (e.g. while waiting for a server), "" to clear.
    """

    def describe(self) -> dict[str, Any]:
        """What generates the answers (recorded with the output, checked on resume)."""

    def answer(
        self, prompts: Sequence[ChatPrompt], on_answer: AnswerCallback | None = None
    ) -> list[str | None]:
        """The target's greedy answer to each prompt, stopped at its end-of-turn token; None
        for a prompt the generator gave no usable text for (counted as BAD_ANSWER). Each
        answer also goes to `on_answer` when it is finished, so that the answers finished
        before a failure of the batch are kept."""


@dataclass(frozen=True)
class SourceRecord:
    """One selected record: its id, its row over all sources, and its messages (None if bad)."""

    record_id: str
    row: int
    messages: list[dict[str, str]] | None
    bad_reason: str | None = None

    @property
    def key(self) -> tuple[str, int]:
        """The resume key of the record's output row."""
        return (self.record_id, self.row)


@dataclass
class RegenerateResult:
    """What a regenerate call did."""

    out: Path
    selected: int = 0
    written: int = 0
    already_done: int = 0
    answers: int = 0
    reused: int = 0
    answers_written: int = 0
    pending: int = 0
    cut_at_max_length: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        """One line for the CLI."""
        skipped = ", ".join(f"{n} {reason}" for reason, n in sorted(self.skipped.items()))
        reused = f" ({self.reused} more kept by the last run)" if self.reused else ""
        return (
            f"{self.out}: {self.written} conversation(s) written, {self.already_done} already "
            f"there, {self.answers} answer(s) generated{reused}, {self.cut_at_max_length} cut "
            f"at data.max_length; skipped: {skipped or 'none'}"
        )

    def describe_kept(self) -> str:
        """What a stopped run kept, for its error message."""
        line = (
            f"Kept: {self.written} conversation(s) with {self.answers_written} answer(s) "
            f"written to {self.out} by this run"
        )
        if self.already_done:
            line += f" ({self.already_done} were there already)"
        if self.pending:
            line += (
                f"; {self.pending} finished answer(s) of the unfinished batch in "
                f"{pending_path(self.out)}, taken from there on resume"
            )
        return line + "."


# ------------------------------------------------------------------------------ the records


def iter_source_rows(specs: Sequence[str], *, hf_cache_dir: Path | None) -> Iterator[Any]:
    """Every record of the sources in order (rows numbered over all sources, as sample ids)."""
    for spec in specs:
        check_source(spec, "the regenerate source")
        if spec == SHAREGPT_SPEC:
            # Lazily: the package holds ~18k conversations and a slice is usually wanted.
            yield from iter_json_array(sharegpt_package_file())
        else:
            for _, record in read_source(spec, hf_cache_dir=hf_cache_dir).rows():
                yield record


def select_records(
    specs: Sequence[str],
    *,
    first: int = 0,
    count: int | None = None,
    hf_cache_dir: Path | None = None,
) -> list[SourceRecord]:
    """Records first..first+count of the sources, normalised; bad ones keep their reason."""
    rows = iter_source_rows(specs, hf_cache_dir=hf_cache_dir)
    stop = None if count is None else first + count
    selected = []
    for row, record in enumerate(islice(rows, first, stop), start=first):
        record_id = _record_id(record, row)
        try:
            messages = answerable_turns(normalise_conversation(record))
        except BadRow as bad:
            selected.append(SourceRecord(record_id, row, None, bad.reason))
            continue
        selected.append(SourceRecord(record_id, row, messages))
    return selected


def _record_id(record: Any, row: int) -> str:
    value = record.get("id") if isinstance(record, dict) else None
    if isinstance(value, (str, int)) and str(value):
        return str(value)
    return f"row-{row}"


def answerable_turns(messages: list[dict[str, str]]) -> list[dict[str, str]]:
    """Drop assistant turns before the first user turn: they answer nothing the target saw."""
    seen_user = False
    kept = []
    for message in messages:
        if message["role"] == "user":
            seen_user = True
        if message["role"] == "assistant" and not seen_user:
            continue
        kept.append(message)
    if not any(m["role"] == "assistant" for m in kept):
        raise BadRow(NO_ASSISTANT_TURN, "no assistant turn after a user turn")
    return kept


# ------------------------------------------------------------------------ the conversations


class PromptRenderer:
    """Renders a conversation so far with the data pipeline's chat template, as token ids."""

    def __init__(self, tokenizer: Any, template: ChatTemplate) -> None:
        self.tokenizer = tokenizer
        self.template = template

    def __call__(self, messages: list[dict[str, str]], max_length: int) -> ChatPrompt:
        """The prompt that asks for the next assistant turn, with its room under max_length."""
        text = render_chat(self.template, messages, self.tokenizer, add_generation_prompt=True)
        ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return ChatPrompt(list(messages), ids, max_length - len(ids))


@dataclass
class _Replay:
    """One conversation being regenerated: the source turns and the turns written so far."""

    source: list[dict[str, str]]
    out: list[dict[str, str]] = field(default_factory=list)
    position: int = 0
    cut: bool = False
    bad_answer: bool = False

    def next_prompt(self, render: PromptRenderer, max_length: int) -> ChatPrompt | None:
        """Copy turns up to the next assistant turn and return its prompt (None when done)."""
        while self.position < len(self.source):
            message = self.source[self.position]
            if message["role"] != "assistant":
                self.out.append(dict(message))
                self.position += 1
                continue
            prompt = render(self.out, max_length)
            if prompt.max_new_tokens < MIN_ANSWER_TOKENS:
                self.cut = True
                self.position = len(self.source)
                return None
            return prompt
        return None

    def add_answer(self, answer: str | None) -> None:
        """Put the target's answer in place of the source's assistant turn; no answer (None)
        ends the conversation as a bad answer."""
        if answer is None:
            self.bad_answer = True
            self.position = len(self.source)
            return
        self.out.append({"role": "assistant", "content": answer})
        self.position += 1

    def conversation(self) -> list[dict[str, str]]:
        """The regenerated turns up to the last answer, as ShareGPT from/value turns."""
        last = max((i for i, m in enumerate(self.out) if m["role"] == "assistant"), default=-1)
        return [
            {"from": SHAREGPT_SPEAKERS[m["role"]], "value": m["content"]}
            for m in self.out[: last + 1]
        ]


def regenerate_chunk(
    records: Sequence[SourceRecord],
    responder: Responder,
    render: PromptRenderer,
    *,
    max_length: int,
) -> list[_Replay]:
    """Regenerate a chunk of good records together, one assistant turn per round."""
    replays = [_Replay(list(r.messages or ())) for r in records]
    while True:
        pending = []
        for replay in replays:
            prompt = replay.next_prompt(render, max_length)
            if prompt is not None:
                pending.append((replay, prompt))
        if not pending:
            return replays
        answers = responder.answer([prompt for _, prompt in pending])
        if len(answers) != len(pending):
            raise RegenerateError(
                f"the generator answered {len(answers)} of {len(pending)} prompts"
            )
        for (replay, _), answer in zip(pending, answers, strict=True):
            replay.add_answer(answer)


def finished_prefix(
    records: Sequence[SourceRecord],
    pending: PendingAnswers,
    render: PromptRenderer,
    *,
    max_length: int,
) -> list[_Replay]:
    """The chunk's conversations whose every answer is kept, up to the first one that is not
    (the rows a stopped run can write without putting the file out of record order)."""
    finished: list[_Replay] = []
    for record in records:
        replay = _Replay(list(record.messages or ()))
        while (prompt := replay.next_prompt(render, max_length)) is not None:
            key = pending.key(_prompt_identity(prompt))
            if key not in pending:
                return finished
            replay.add_answer(pending.get(key))
        finished.append(replay)
    return finished


def _prompt_identity(prompt: ChatPrompt) -> Any:
    """What an answer depends on beyond the run's settings: the conversation and its room."""
    return [prompt.messages, prompt.max_new_tokens]


class _Remembering:
    """A responder that answers from the pending file what a stopped run kept, asks its inner
    responder the rest, and keeps each new answer there as soon as it is finished."""

    def __init__(self, inner: Responder, pending: PendingAnswers, result: RegenerateResult):
        self.inner = inner
        self.pending = pending
        self.result = result
        self._lock = threading.Lock()

    def describe(self) -> dict[str, Any]:
        """The inner responder's description."""
        return self.inner.describe()

    def answer(
        self, prompts: Sequence[ChatPrompt], on_answer: AnswerCallback | None = None
    ) -> list[str | None]:
        """Kept answers first; the inner responder for the others."""
        keys = [self.pending.key(_prompt_identity(p)) for p in prompts]
        answers: list[str | None] = [None] * len(prompts)
        ask = []
        for index, key in enumerate(keys):
            if key in self.pending:
                answers[index] = self.pending.get(key)
                self.result.reused += answers[index] is not None
            else:
                ask.append(index)
        if not ask:
            return answers
        kept: set[int] = set()

        def keep(position: int, answer: str | None) -> None:
            # On the responder's request threads: one answer at a time.
            with self._lock:
                if position in kept:
                    return
                kept.add(position)
                self.pending.add(keys[ask[position]], answer)
                self.result.answers += answer is not None

        fresh = self.inner.answer([prompts[i] for i in ask], on_answer=keep)
        if len(fresh) != len(ask):
            raise RegenerateError(f"the generator answered {len(fresh)} of {len(ask)} prompts")
        for position, answer in enumerate(fresh):
            keep(position, answer)  # a responder that does not call on_answer
            answers[ask[position]] = answer
        return answers


# ------------------------------------------------------------------------------------- run


def regenerate(
    records: Sequence[SourceRecord],
    out: str | Path,
    *,
    responder: Responder,
    render: PromptRenderer,
    max_length: int,
    settings: dict[str, Any],
    batch_size: int = 16,
    progress: bool = True,
) -> RegenerateResult:
    """Regenerate `records` into the JSONL file `out`, resuming what is already there."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, not {batch_size}")
    result = RegenerateResult(Path(out), selected=len(records))
    usable = _usable(records, render, max_length, result)
    output = RegeneratedFile(Path(out), {**settings, "generator": responder.describe()})
    done = output.open()
    pending = PendingAnswers(pending_path(Path(out)), output.settings)
    pending.open()
    asker = _Remembering(responder, pending, result)
    bar = _progress(len(records), progress)
    if bar is not None:
        bar.update(len(records) - len(usable))
        if hasattr(responder, "show_status"):
            responder.show_status = bar.set_postfix_str
    complete = False
    try:
        # Fixed chunks: a chunk that must be (re)done is generated whole, so batch padding and
        # concurrency are the same as in an uninterrupted run, and so are the answers.
        for start in range(0, len(usable), batch_size):
            chunk = usable[start : start + batch_size]
            todo = [r for r in chunk if r.key not in done]
            result.already_done += len(chunk) - len(todo)
            if todo:
                try:
                    replays = regenerate_chunk(chunk, asker, render, max_length=max_length)
                except BaseException as exc:
                    _keep_finished(chunk, done, output, pending, render, max_length, result)
                    if isinstance(exc, RegenerateError):
                        exc.result = result
                    raise
                output.append(_rows(chunk, replays, done, result))
                # The chunk is in the output (synced): its kept answers are not needed again.
                pending.clear()
            if bar is not None:
                bar.update(len(chunk))
        complete = True
    finally:
        if bar is not None:
            if hasattr(responder, "show_status"):
                responder.show_status = None
            bar.close()
        output.close()
        pending.close(remove=complete)
    return result


def _rows(
    records: Sequence[SourceRecord],
    replays: Sequence[_Replay],
    done: set[tuple[str, int]],
    result: RegenerateResult,
) -> list[dict[str, Any]]:
    """The output rows of regenerated records not in the file yet, counted into `result`."""
    rows = []
    for record, replay in zip(records, replays, strict=True):
        if record.key in done:
            continue
        if replay.bad_answer:
            result.skipped[BAD_ANSWER] = result.skipped.get(BAD_ANSWER, 0) + 1
            continue
        result.cut_at_max_length += int(replay.cut)
        conversation = replay.conversation()
        result.answers_written += sum(turn["from"] == "gpt" for turn in conversation)
        rows.append(
            {"id": record.record_id, "source_row": record.row, "conversations": conversation}
        )
    result.written += len(rows)
    return rows


def _keep_finished(
    chunk: Sequence[SourceRecord],
    done: set[tuple[str, int]],
    output: RegeneratedFile,
    pending: PendingAnswers,
    render: PromptRenderer,
    max_length: int,
    result: RegenerateResult,
) -> None:
    """After a chunk failed: write its finished conversations that keep the file in record
    order, and make the other kept answers durable for the next run."""
    try:
        finished = finished_prefix(chunk, pending, render, max_length=max_length)
        if finished:
            output.append(_rows(chunk[: len(finished)], finished, done, result))
        pending.sync()
    except OSError:
        # The failure being raised matters more; the answers are still in the pending file.
        pass
    result.pending = len(pending)


def _usable(
    records: Sequence[SourceRecord],
    render: PromptRenderer,
    max_length: int,
    result: RegenerateResult,
) -> list[SourceRecord]:
    """The records that can be regenerated: well-formed, and a first prompt under max_length."""
    usable = []
    for record in records:
        reason = record.bad_reason
        if (
            reason is None
            and _Replay(list(record.messages or ())).next_prompt(render, max_length) is None
        ):
            reason = PROMPT_TOO_LONG
        if reason is not None:
            result.skipped[reason] = result.skipped.get(reason, 0) + 1
            continue
        usable.append(record)
    return usable


def _progress(total: int, enabled: bool) -> Any:
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="regenerating", unit="conv", dynamic_ncols=True)
