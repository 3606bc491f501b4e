"""What the linter needs to know about the target model, read from its JSON files without torch.

`config.json` gives the layer count, vocabulary and hidden sizes (multimodal configs nest them
under `text_config`); `generation_config.json` and `tokenizer_config.json` add pad, eos and bos
ids (a single id or a list, as Llama 3's generation config has). Special tokens named by their
text are looked up in `tokenizer_config.json`'s `added_tokens_decoder`, or, where transformers 5
no longer writes it (SmolLM2, Llama), in `tokenizer.json`'s `added_tokens`. Reading these files
keeps `specdraft lint` fast and free of torch and transformers.

`suggest_target_layer_ids` gives the layer taps of the published DFlash drafts for any depth.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any


class TargetUnreadable(Exception):
    """The target folder exists (or was asked for) but its config cannot be read."""


@dataclass(frozen=True)
class TargetInfo:
    """The facts about a target that config rules check against (None = not stated)."""

    folder: str
    num_layers: int | None
    vocab_size: int | None
    hidden_size: int | None
    pad_ids: frozenset[int]
    eos_ids: frozenset[int]
    bos_ids: frozenset[int] = frozenset()
    # The tokenizer's added (special) tokens as (id, text), in id order.
    special_tokens: tuple[tuple[int, str], ...] = ()
    # The decoder's shape the draft copies (model.init_from compares a draft folder with it).
    intermediate_size: int | None = None
    num_attention_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    rope_theta: float | None = None

    def token_text(self, token_id: int) -> str | None:
        """The text of a special token id, if the tokenizer names it."""
        return dict(self.special_tokens).get(token_id)


def read_target_info(folder: str | Path) -> TargetInfo:
    """Read a HF model folder's config files; raise TargetUnreadable naming the file and reason."""
    root = Path(folder)
    config = _read_json(root / "config.json", required=True)
    generation = _read_json(root / "generation_config.json", required=False)
    tokenizer = _read_json(root / "tokenizer_config.json", required=False)
    nested = config.get("text_config")
    text: dict[str, Any] = nested if isinstance(nested, dict) else {}

    def pick(*names: str) -> Any:
        for source in (config, text):
            for name in names:
                if source.get(name) is not None:
                    return source[name]
        return None

    special = _special_tokens(tokenizer, root)
    by_content = {content: token_id for token_id, content in reversed(special)}

    def ids_of(kind: str) -> frozenset[int]:
        key = f"{kind}_token_id"
        content = _token_content(tokenizer.get(f"{kind}_token"))
        named = by_content.get(content) if content is not None else None
        return frozenset(_ids(pick(key)) | _ids(generation.get(key)) | _ids(named))

    heads, hidden = _int(pick("num_attention_heads")), _int(pick("hidden_size", "n_embd"))
    return TargetInfo(
        folder=str(root),
        num_layers=_int(pick("num_hidden_layers", "num_layers", "n_layer")),
        vocab_size=_int(pick("vocab_size")),
        hidden_size=hidden,
        pad_ids=ids_of("pad"),
        eos_ids=ids_of("eos"),
        bos_ids=ids_of("bos"),
        special_tokens=special,
        intermediate_size=_int(pick("intermediate_size")),
        num_attention_heads=heads,
        num_key_value_heads=_int(pick("num_key_value_heads")) or heads,
        head_dim=_int(pick("head_dim")) or (hidden // heads if hidden and heads else None),
        rope_theta=_theta(pick("rope_parameters"), pick("rope_theta")),
    )


def suggest_target_layer_ids(num_layers: int, count: int) -> list[int]:
    """`count` layer ids spread evenly from layer 1 to num_layers - 3, as the DFlash drafts tap.

    The published DFlash drafts (z-lab's `build_target_layer_ids`, also in speculators) round
    `1 + i * (num_layers - 4) / (count - 1)` half to even, as Python's `round` does: 36 layers
    and 5 taps give [1, 9, 17, 25, 33], 30 layers [1, 8, 14, 20, 27]; one tap is the middle
    layer. A target too shallow for `count` distinct layers in 1..num_layers-3 spreads them over
    every layer but the last (4 layers, 2 taps: [0, 2]). Raises ValueError when even that is
    too few.
    """
    if count < 1:
        raise ValueError(f"count must be at least 1, not {count}")
    if count > num_layers - 1:
        raise ValueError(
            f"a target with {num_layers} decoder layers has {max(num_layers - 1, 0)} layers a "
            f"draft may tap (the last is not allowed), fewer than {count}"
        )
    if count == 1:
        return [min(num_layers // 2, num_layers - 2)]
    first, last = 1, num_layers - 3
    if last - first + 1 < count:
        first, last = 0, num_layers - 2
    return [round(first + Fraction(i * (last - first), count - 1)) for i in range(count)]


def _read_json(path: Path, *, required: bool) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        if required:
            raise TargetUnreadable(f"{path}: not found") from exc
        return {}
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise TargetUnreadable(f"{path}: {exc}") from exc
    if not isinstance(data, dict):
        raise TargetUnreadable(f"{path}: expected a JSON object")
    return data


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _theta(parameters: Any, theta: Any) -> float | None:
    """RoPE theta from transformers 5's `rope_parameters` or the older `rope_theta`."""
    if isinstance(parameters, dict) and isinstance(parameters.get("rope_theta"), (int, float)):
        return float(parameters["rope_theta"])
    return float(theta) if isinstance(theta, (int, float)) else None


def _ids(value: Any) -> set[int]:
    """Token ids from an int, a list of ints, or nothing."""
    if _int(value) is not None:
        return {value}
    if isinstance(value, list):
        return {v for v in value if _int(v) is not None}
    return set()


def _token_content(token: Any) -> str | None:
    """A special token as written in tokenizer_config.json: a string or {"content": ...}."""
    if isinstance(token, dict):
        token = token.get("content")
    return token if isinstance(token, str) else None


def _special_tokens(tokenizer: dict[str, Any], root: Path) -> tuple[tuple[int, str], ...]:
    """The added tokens as sorted (id, text): tokenizer_config.json's `added_tokens_decoder`,
    else tokenizer.json's `added_tokens` (no tokenizer load needed)."""
    out: dict[int, str] = {}
    decoder = tokenizer.get("added_tokens_decoder")
    if isinstance(decoder, dict):
        for raw_id, entry in decoder.items():
            content = _token_content(entry)
            if content is not None and str(raw_id).isdigit():
                out.setdefault(int(raw_id), content)
    else:
        for entry in _added_tokens(root / "tokenizer.json"):
            content, token_id = _token_content(entry), _int(entry.get("id"))
            if content is not None and token_id is not None:
                out.setdefault(token_id, content)
    return tuple(sorted(out.items()))


# tokenizers writes `added_tokens` before the (large) vocabulary: the list is decoded alone, from
# the file's head when it is there (a full read of Qwen3's 11 MB file is what this saves).
_ADDED_TOKENS = re.compile(r'"added_tokens"\s*:\s*(?=\[)')
_HEAD_BYTES = 1 << 18


def _added_tokens(path: Path) -> list[dict[str, Any]]:
    """tokenizer.json's `added_tokens` list ([] when the file is missing or unreadable)."""
    try:
        with path.open("rb") as handle:
            head = handle.read(_HEAD_BYTES)
            value = _decode_added_tokens(head.decode("utf-8", errors="ignore"))
            if value is None:
                value = _decode_added_tokens((head + handle.read()).decode("utf-8"))
    except (OSError, UnicodeDecodeError):
        return []
    return [entry for entry in value if isinstance(entry, dict)] if value is not None else []


def _decode_added_tokens(text: str) -> list[Any] | None:
    """The `added_tokens` array decoded from (a head of) tokenizer.json, or None."""
    found = _ADDED_TOKENS.search(text)
    if found is None:
        return None
    try:
        value, _ = json.JSONDecoder().raw_decode(text, found.end())
    except ValueError:
        return None
    return value if isinstance(value, list) else None
