"""What the linter needs to know about the target model, read from its JSON files without torch.

`config.json` gives the layer count, vocabulary and hidden sizes (multimodal configs nest them
under `text_config`); `generation_config.json` and `tokenizer_config.json` add pad and eos ids.
Reading these small files keeps `specdraft lint` fast and free of torch and transformers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
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

    pad_ids = _ids(pick("pad_token_id")) | _ids(generation.get("pad_token_id"))
    eos_ids = _ids(pick("eos_token_id")) | _ids(generation.get("eos_token_id"))
    by_content = _special_token_ids(tokenizer)
    pad_ids |= _ids(by_content.get(_token_content(tokenizer.get("pad_token"))))
    eos_ids |= _ids(by_content.get(_token_content(tokenizer.get("eos_token"))))
    return TargetInfo(
        folder=str(root),
        num_layers=_int(pick("num_hidden_layers", "num_layers", "n_layer")),
        vocab_size=_int(pick("vocab_size")),
        hidden_size=_int(pick("hidden_size", "n_embd")),
        pad_ids=frozenset(pad_ids),
        eos_ids=frozenset(eos_ids),
    )


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


def _special_token_ids(tokenizer: dict[str, Any]) -> dict[str | None, int]:
    """Map special-token text to id from `added_tokens_decoder` (no tokenizer load needed)."""
    decoder = tokenizer.get("added_tokens_decoder")
    if not isinstance(decoder, dict):
        return {}
    out: dict[str | None, int] = {}
    for raw_id, entry in decoder.items():
        content = _token_content(entry)
        if content is not None and str(raw_id).isdigit():
            out.setdefault(content, int(raw_id))
    return out
