"""Wiring of `specdraft regenerate`: a config and options in, a regenerated JSONL file out."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specdraft.config import Config

from .replay import PromptRenderer, RegenerateResult, regenerate, select_records

DEFAULT_MAX_NEW_TOKENS = 256
DEFAULT_BATCH_SIZE = 16


def regenerate_from_config(
    config: Config,
    out: str | Path,
    *,
    first: int = 0,
    count: int | None = None,
    sources: Sequence[str] = (),
    endpoint: str | None = None,
    model: str | None = None,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    batch_size: int = DEFAULT_BATCH_SIZE,
    progress: bool = True,
    api_key: str | None = None,
    timeout_s: float | None = None,
    retry_for_s: float | None = None,
) -> RegenerateResult:
    """Regenerate records first..first+count of `sources` (default data.train_paths) into `out`."""
    from ..data import load_tokenizer, resolve_chat_template
    from ..runtime.cache import cache_root

    specs = list(sources) or list(config.data.train_paths)
    if not sources and config.data.format != "sharegpt":
        raise ValueError(
            f"data.format = {config.data.format!r}: data.train_paths are feature folders, not "
            "conversations; name the conversations with --source"
        )
    tokenizer, tokenizer_path = load_tokenizer(config)
    template = resolve_chat_template(
        config.data.chat_template, tokenizer, tokenizer_path=tokenizer_path
    )
    records = select_records(
        specs,
        first=first,
        count=count,
        hf_cache_dir=cache_root(config.data.cache_dir) / "hf-json",
    )
    responder: Any
    if endpoint:
        from .endpoint import DEFAULT_RETRY_FOR_S, DEFAULT_TIMEOUT_S, EndpointResponder

        responder = EndpointResponder(
            endpoint,
            model=model,
            max_new_tokens=max_new_tokens,
            concurrency=batch_size,
            timeout_s=DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s,
            retry_for_s=DEFAULT_RETRY_FOR_S if retry_for_s is None else retry_for_s,
            api_key=api_key,
        )
    else:
        from .local import LocalResponder

        responder = LocalResponder(config.model.target, tokenizer, max_new_tokens=max_new_tokens)
    settings = {
        "sources": specs,
        "chat_template": config.data.chat_template,
        "tokenizer": config.data.tokenizer or config.model.target,
        "max_length": config.data.max_length,
    }
    return regenerate(
        records,
        out,
        responder=responder,
        render=PromptRenderer(tokenizer, template),
        max_length=config.data.max_length,
        settings=settings,
        batch_size=batch_size,
        progress=progress,
    )
