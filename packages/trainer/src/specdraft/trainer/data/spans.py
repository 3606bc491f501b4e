"""Where the assistant turns are in a rendered conversation, in characters.

The loss mask must hold for any tokenizer that carries a chat template, so it is not derived
from the special-token ids of one format. The assistant spans are found in the text instead:

- the conversation is rendered once more with a marker in place of each assistant content;
  where the markers land is where the contents are. This holds for templates that render a turn
  differently when it is the last one (Qwen3's adds an empty think block to the last answer), for
  which rendering prefixes would not give prefixes of the full text;
- the end-of-turn text of turn i (`<|im_end|>`, `<|eot_id|>`, `</s>`, ...) is what the template
  writes after the content when turn i is the last one, less whitespace: it is supervised, the
  newline after it is not;
- a template that rewrites contents (so the markers cannot be mapped back) falls back to prefix
  renderings: turn i starts where `render(messages[:i], add_generation_prompt=True)` ends and ends
  where `render(messages[:i+1])` ends, less whitespace.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from .chat_template import ChatTemplate, render_chat


class TemplateSpanError(ValueError):
    """The chat template renders a conversation in a way whose assistant turns cannot be found."""


def assistant_char_spans(
    messages: Sequence[dict[str, str]],
    tokenizer: Any,
    template: ChatTemplate,
    text: str | None = None,
) -> Iterator[tuple[int, int]]:
    """Yield the (start, end) character span of each assistant turn in the rendered `text`.

    Spans are computed lazily, in order, so a caller that stops early (truncation) does not pay
    for the renderings of later turns.
    """
    if text is None:
        text = render_chat(template, messages, tokenizer)
    layout = _sentinel_layout(messages, tokenizer, template, text)
    if layout is not None:
        for i, (start, end) in layout:
            yield start, end + _end_marker_length(messages, i, tokenizer, template, text, end)
        return
    for i, message in enumerate(messages):
        if message["role"] == "assistant":
            yield _span_by_prefix(messages, i, tokenizer, template, text)


def _sentinel(i: int) -> str:
    # Private-use code points: no tokenizer or template gives them a meaning.
    return f"\ue000{i}\ue001"


def _with_sentinels(messages: Sequence[dict[str, str]]) -> list[dict[str, str]]:
    return [
        {**m, "content": _sentinel(i)} if m["role"] == "assistant" else dict(m)
        for i, m in enumerate(messages)
    ]


def _sentinel_layout(
    messages: Sequence[dict[str, str]], tokenizer: Any, template: ChatTemplate, text: str
) -> list[tuple[int, tuple[int, int]]] | None:
    """Where each assistant content sits in `text`, found by rendering the conversation with a
    marker in place of every assistant content; None when the template does not place contents
    verbatim (it trims or rewrites them), so the markers cannot be mapped back."""
    marked = render_chat(template, _with_sentinels(messages), tokenizer)
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    pieces: list[str] = []
    rest = marked
    for i in turns:
        before, found, rest = rest.partition(_sentinel(i))
        if not found:
            return None
        pieces.append(before)
    for strip in (False, True):
        contents = [
            messages[i]["content"].strip() if strip else messages[i]["content"] for i in turns
        ]
        rebuilt = "".join(p + c for p, c in zip(pieces, contents, strict=True)) + rest
        if rebuilt != text:
            continue
        spans, position = [], 0
        for i, piece, content in zip(turns, pieces, contents, strict=True):
            start = position + len(piece)
            position = start + len(content)
            spans.append((i, (start, position)))
        return spans
    return None


def _end_marker_length(
    messages: Sequence[dict[str, str]],
    i: int,
    tokenizer: Any,
    template: ChatTemplate,
    text: str,
    end: int,
) -> int:
    """Length of the end-of-turn text after assistant turn i: what the template writes after
    the content when the turn is the last one, less whitespace, if the full rendering has it."""
    marked = render_chat(template, _with_sentinels(messages[: i + 1]), tokenizer)
    tail = marked.rpartition(_sentinel(i))[2].rstrip()
    return len(tail) if tail and text.startswith(tail, end) else 0


def _span_by_prefix(
    messages: Sequence[dict[str, str]], i: int, tokenizer: Any, template: ChatTemplate, text: str
) -> tuple[int, int]:
    """The span of turn i from prefix renderings: it starts where the generation prompt after
    turn i-1 ends and ends where the rendering of turns 0..i ends, less whitespace."""
    try:
        prompt = render_chat(template, messages[:i], tokenizer, add_generation_prompt=True)
    except Exception:
        # No generation prompt for an empty conversation (an answer first, as in some ShareGPT
        # rows): the same turn with a marker for content shows where its content starts.
        marked = [*messages[:i], {**messages[i], "content": _sentinel(i)}]
        prompt = render_chat(template, marked, tokenizer).partition(_sentinel(i))[0]
    upto = render_chat(template, messages[: i + 1], tokenizer)
    if not text.startswith(upto):
        raise _unstable(template, i, "it renders differently once later turns follow")
    # A generation prompt may differ from the header of a finished turn (an empty think block,
    # say): the answer starts where the two renderings part.
    start = _common_prefix_length(prompt, upto)
    end = max(start, len(upto.rstrip()))
    return start, end


def _unstable(template: ChatTemplate, i: int, why: str) -> TemplateSpanError:
    return TemplateSpanError(
        f"chat template {template.choice!r}: cannot find assistant turn {i} in the rendered "
        f"conversation: the template changes assistant contents and {why}; use a template "
        f"that writes contents verbatim (for example data.chat_template = 'qwen')"
    )


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
