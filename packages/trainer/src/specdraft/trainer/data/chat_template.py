"""The chat template choice (`data.chat_template`) and rendering a conversation to text."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The Qwen chat format (ChatML): every turn is `<|im_start|>{role}\n{content}<|im_end|>\n` and the
# generation prompt opens an assistant turn. No default system prompt is inserted, so a rendered
# conversation holds exactly the turns of the data.
QWEN_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}"
    "{{- '<|im_start|>assistant\\n' -}}"
    "{%- endif -%}"
)

TEMPLATE_CHOICES_HINT = "use 'tokenizer', 'qwen' or the path of a Jinja template file"


class ChatTemplateError(ValueError):
    """The configured chat template cannot be used (missing file, no template on the tokenizer)."""


@dataclass(frozen=True)
class ChatTemplate:
    """A resolved chat template: what was asked for (`choice`) and the Jinja source it means."""

    choice: str
    source: str


def resolve_chat_template(choice: str, tokenizer: Any, *, tokenizer_path: str = "") -> ChatTemplate:
    """Turn a `data.chat_template` value into Jinja source: 'tokenizer', 'qwen' or a file path."""
    if choice == "qwen":
        return ChatTemplate(choice, QWEN_CHAT_TEMPLATE)
    if choice == "tokenizer":
        source = getattr(tokenizer, "chat_template", None)
        if isinstance(source, dict):
            # Tokenizers with several named templates keep the chat one under 'default'.
            source = source.get("default")
        if not source:
            where = f" at {tokenizer_path}" if tokenizer_path else ""
            raise ChatTemplateError(
                f"data.chat_template = 'tokenizer' but the tokenizer{where} carries no chat "
                f"template; set data.chat_template = 'qwen' or the path of a Jinja template file"
            )
        return ChatTemplate(choice, source)
    path = Path(choice).expanduser()
    if not path.is_file():
        raise ChatTemplateError(
            f"data.chat_template = {choice!r}: no such file; {TEMPLATE_CHOICES_HINT}"
        )
    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ChatTemplateError(f"data.chat_template = {choice!r}: cannot read it ({exc})") from exc
    if not source.strip():
        raise ChatTemplateError(f"data.chat_template = {choice!r}: the file is empty")
    return ChatTemplate(choice, source)


def render_chat(
    template: ChatTemplate,
    messages: Sequence[dict[str, str]],
    tokenizer: Any,
    *,
    add_generation_prompt: bool = False,
) -> str:
    """Render role/content messages to text with the template (no tokenisation)."""
    return tokenizer.apply_chat_template(
        list(messages),
        chat_template=template.source,
        tokenize=False,
        add_generation_prompt=add_generation_prompt,
    )
