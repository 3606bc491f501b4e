"""Render a conversation with a chat template, tokenise it, and build its assistant-only loss
mask from the assistant spans (see spans.py), cut to max_length.

The text is tokenised piece by piece at the span boundaries, which is also where an answer
starts at inference (right after the generation prompt), so the mask is exact. Tokenizers that
mark the start of every text they encode (SentencePiece-style word markers, a byte-level prefix
space) would put a spurious marker at every boundary; for them the whole text is tokenised once
and each token is supervised when it starts inside an assistant span.
"""

from __future__ import annotations

import contextlib
import json
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .chat_template import ChatTemplate, render_chat
from .spans import assistant_char_spans


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
    messages, cut = cut_long_turns(messages, max_length)
    text = render_chat(template, messages, tokenizer)
    spans = assistant_char_spans(messages, tokenizer, template, text)
    if encodes_piecewise(tokenizer):
        out = _by_pieces(text, spans, tokenizer, max_length)
    else:
        out = _by_offsets(text, spans, tokenizer, max_length)
    if cut and not out.truncated:
        out = TokenizedConversation(out.input_ids, out.loss_mask, True)
    return out


# No token of a real vocabulary spans more than this many characters (long BPE merges of code
# indentation reach a few dozen), so the first max_length tokens of any text lie within its
# first max_length * MAX_CHARS_PER_TOKEN characters.
MAX_CHARS_PER_TOKEN = 64


def turn_char_budget(max_length: int) -> int:
    """Characters of one turn that can still matter when a sample is cut to max_length tokens."""
    return max_length * MAX_CHARS_PER_TOKEN


def cut_long_turns(
    messages: Sequence[dict[str, str]], max_length: int
) -> tuple[Sequence[dict[str, str]], bool]:
    """Cut every turn to `turn_char_budget(max_length)` characters; return (messages, any cut).

    Beyond the budget a turn's text cannot reach the first max_length tokens, so cutting it
    changes no kept token; it keeps a hostile multi-megabyte turn from being rendered and
    tokenised in full.
    """
    budget = turn_char_budget(max_length)
    if all(len(m["content"]) <= budget for m in messages):
        return messages, False
    return [{**m, "content": m["content"][:budget]} for m in messages], True


def trim_unsupervised_tail(conversation: TokenizedConversation) -> TokenizedConversation:
    """Drop the tokens after the last supervised one (e.g. a trailing user turn).

    They carry no loss and no draft block can see them (context stops before each anchor, and
    anchors sit on supervised tokens), so they would only be padding that costs positions.
    """
    mask = conversation.loss_mask
    last = max((i for i, m in enumerate(mask) if m), default=-1)
    if last + 1 == len(mask):
        return conversation
    return TokenizedConversation(
        conversation.input_ids[: last + 1], mask[: last + 1], conversation.truncated
    )


def _by_pieces(text: str, spans: Any, tokenizer: Any, max_length: int) -> TokenizedConversation:
    ids: list[int] = []
    mask: list[int] = []
    cursor = 0
    for start, end in spans:
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


def _by_offsets(text: str, spans: Any, tokenizer: Any, max_length: int) -> TokenizedConversation:
    encoding = tokenizer.backend_tokenizer.encode(text, add_special_tokens=False)
    ids, offsets = encoding.ids[:max_length], encoding.offsets[:max_length]
    # Characters beyond the last kept token do not matter: stop asking for spans there.
    horizon = offsets[-1][1] if offsets else 0
    mask = [0] * len(ids)
    position = 0
    for start, end in spans:
        if start >= horizon:
            break
        while position < len(ids) and offsets[position][0] < start:
            position += 1
        while position < len(ids) and offsets[position][0] < end:
            mask[position] = 1
            position += 1
    return TokenizedConversation(ids, mask, len(encoding.ids) > max_length)


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


_PIECEWISE: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def encodes_piecewise(tokenizer: Any) -> bool:
    """Whether pieces of a text may be encoded apart and concatenated: true for byte-level BPE
    without a prefix space (Qwen, Llama 3, GPT-4 style); false when the tokenizer prepends a
    marker to every text it encodes (Llama 2 and Mistral's SentencePiece word marker)."""
    try:
        return _PIECEWISE[tokenizer]
    except (KeyError, TypeError):
        pass
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return True  # a slow tokenizer has no offsets; encoding pieces is all it can do
    state = json.loads(backend.to_str())
    piecewise = not any(
        _prepends(state.get(part) or {}) for part in ("normalizer", "pre_tokenizer")
    )
    with contextlib.suppress(TypeError):
        _PIECEWISE[tokenizer] = piecewise
    return piecewise


def _prepends(node: dict[str, Any]) -> bool:
    """Whether a normalizer / pre-tokenizer tree adds something at the start of every text."""
    kind = node.get("type")
    if kind == "Sequence":
        children = node.get("normalizers") or node.get("pretokenizers") or []
        return any(_prepends(child) for child in children)
    if kind == "Prepend":
        return True
    if kind == "Metaspace":
        scheme = node.get("prepend_scheme")
        return scheme in ("always", "first") if scheme else bool(node.get("add_prefix_space"))
    if kind == "ByteLevel":
        return bool(node.get("add_prefix_space"))
    return False
