"""Render a conversation with a chat template and build its assistant-only loss mask.

The mask must hold for any tokenizer that carries a chat template, so it is not derived from
special-token ids of one format. Instead the assistant spans are found in characters by
rendering prefixes of the conversation:

- the span of assistant turn i starts where `render(messages[:i], add_generation_prompt=True)`
  ends (the header of the turn is prompt, not answer);
- it ends where `render(messages[:i+1])` ends, less trailing whitespace: the end-of-turn token
  (`<|im_end|>`, `</s>`, `<|eot_id|>`, ...) is supervised, the newline after it is not.

A template that rewrites earlier turns once later ones exist (Qwen3 drops old reasoning, for
one) breaks the prefix property; its spans are then found by locating each assistant content in
the full rendering. The text is tokenised piece by piece at the span boundaries, which is also
where an answer starts at inference (after the generation prompt), so the mask is exact.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .chat_template import ChatTemplate, render_chat


class TemplateSpanError(ValueError):
    """The chat template renders a conversation in a way whose assistant turns cannot be found."""


@dataclass(frozen=True)
class TokenizedConversation:
    """One conversation as training input: token ids, the 0/1 loss mask, and whether it was cut."""

    input_ids: list[int]
    loss_mask: list[int]
    truncated: bool


def tokenize_conversation(
    messages: Sequence[dict[str, str]],
    tokenizer: Any,
    template: ChatTemplate,
    max_length: int,
) -> TokenizedConversation:
    """Render, tokenise and mask one conversation (assistant turns only), cut to max_length."""
    text = render_chat(template, messages, tokenizer)
    ids: list[int] = []
    mask: list[int] = []
    cursor = 0
    for start, end in assistant_char_spans(messages, tokenizer, template, text):
        _extend(ids, mask, tokenizer, text[cursor:start], 0)
        _extend(ids, mask, tokenizer, text[start:end], 1)
        cursor = end
        if len(ids) >= max_length:
            # Later turns would be cut anyway; rendering them is the expensive part.
            truncated = len(ids) > max_length or cursor < len(text)
            return TokenizedConversation(ids[:max_length], mask[:max_length], truncated)
    _extend(ids, mask, tokenizer, text[cursor:], 0)
    truncated = len(ids) > max_length
    return TokenizedConversation(ids[:max_length], mask[:max_length], truncated)


def _extend(ids: list[int], mask: list[int], tokenizer: Any, piece: str, value: int) -> None:
    if not piece:
        return
    new = _encode(tokenizer, piece)
    ids.extend(new)
    mask.extend([value] * len(new))


def _encode(tokenizer: Any, text: str) -> list[int]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        # The Rust tokenizer directly: the Python wrapper costs more than encoding a short piece.
        return backend.encode(text, add_special_tokens=False).ids
    return tokenizer.encode(text, add_special_tokens=False)


def assistant_char_spans(
    messages: Sequence[dict[str, str]],
    tokenizer: Any,
    template: ChatTemplate,
    text: str | None = None,
) -> Iterator[tuple[int, int]]:
    """Yield the (start, end) character span of each assistant turn in the rendered `text`.

    Spans are computed lazily, in order, so a caller that stops early (truncation) does not pay
    for rendering the prefixes of later turns.
    """
    if text is None:
        text = render_chat(template, messages, tokenizer)
    by_prefix = True
    cursor = 0
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        span = _span_by_prefix(messages, i, tokenizer, template, text) if by_prefix else None
        if span is None:
            by_prefix = False
            span = _span_by_search(messages, i, tokenizer, template, text, cursor)
        cursor = span[1]
        yield span


def _span_by_prefix(
    messages: Sequence[dict[str, str]], i: int, tokenizer: Any, template: ChatTemplate, text: str
) -> tuple[int, int] | None:
    try:
        prompt = render_chat(template, messages[:i], tokenizer, add_generation_prompt=True)
    except Exception:
        # Some templates refuse a conversation that does not start with a user turn.
        return None
    upto = render_chat(template, messages[: i + 1], tokenizer)
    if not text.startswith(upto):
        return None
    # A generation prompt may differ from the header of a finished turn (an empty think block,
    # say): the answer starts where the two renderings part.
    start = _common_prefix_length(prompt, upto)
    end = max(start, len(upto.rstrip()))
    return start, end


def _span_by_search(
    messages: Sequence[dict[str, str]],
    i: int,
    tokenizer: Any,
    template: ChatTemplate,
    text: str,
    cursor: int,
) -> tuple[int, int]:
    content = messages[i]["content"]
    for needle in (content, content.strip()):
        found = text.find(needle, cursor) if needle else -1
        if found >= 0:
            break
    else:
        raise TemplateSpanError(
            f"chat template {template.choice!r}: assistant turn {i} is neither a prefix-stable "
            f"rendering nor found verbatim in the rendered conversation; use a template that "
            f"renders assistant contents unchanged (for example data.chat_template = 'qwen')"
        )
    end = found + len(needle)
    # The end-of-turn marker is whatever the template puts after the content when the turn is
    # the last one, less whitespace; it is supervised only if the full rendering has it too.
    upto = render_chat(template, messages[: i + 1], tokenizer)
    at = upto.rfind(needle)
    tail = upto[at + len(needle) :].rstrip() if at >= 0 and needle else ""
    if tail and text.startswith(tail, end):
        end += len(tail)
    return found, end


def _common_prefix_length(a: str, b: str) -> int:
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo
