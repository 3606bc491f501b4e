"""The tiny target: a ~1.9M-parameter Qwen3ForCausalLM briefly pretrained on ShareGPT chats.

Its only job is to stand in for a real target in tests and the quickstart: the right
architecture, the tiny tokenizer's vocabulary, and greedy answers that are not one token
repeated, so acceptance-length evaluations measure something. Built once per recipe and cached
with its tokenizer files and a generation config (eos = <|im_end|>).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

from ..runtime.cache import build_once, cache_root, recipe_hash
from .corpus import sharegpt_conversations
from .info import (
    TARGET_HEAD_DIM,
    TARGET_HIDDEN_SIZE,
    TARGET_INTERMEDIATE_SIZE,
    TARGET_NUM_HEADS,
    TARGET_NUM_KV_HEADS,
    TARGET_NUM_LAYERS,
    TINY_VOCAB_SIZE,
    tiny_assets_info,
)
from .tokenizer import INFO_FILE, build_tiny_tokenizer, tokenizer_recipe

_RECIPE_VERSION = 1
# Pretraining budget: about 1.5 minutes on one busy CPU core (400 steps of 8 x 128 tokens).
_TRAIN = {
    "records": [3000, 1500],  # after the tokenizer's slice, so the two do not share text
    # Short chats only, seen a few times each: within the budget a 2M model learns the chat
    # structure and some phrases from a small set, but only noise from a large one.
    "max_chars": 2500,
    "seq_len": 128,
    "batch_size": 8,
    "steps": 400,
    "lr": 5e-3,
    "warmup": 30,
    "weight_decay": 0.01,
    "seed": 1234,
}


def target_config_dict() -> dict[str, Any]:
    """The Qwen3 config of the tiny target (sizes, special ids)."""
    info = tiny_assets_info()
    return {
        "vocab_size": TINY_VOCAB_SIZE,
        "hidden_size": TARGET_HIDDEN_SIZE,
        "intermediate_size": TARGET_INTERMEDIATE_SIZE,
        "num_hidden_layers": TARGET_NUM_LAYERS,
        "num_attention_heads": TARGET_NUM_HEADS,
        "num_key_value_heads": TARGET_NUM_KV_HEADS,
        "head_dim": TARGET_HEAD_DIM,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        # Untied, as in Qwen3-8B: the draft reads embed_tokens and lm_head from the safetensors.
        "tie_word_embeddings": False,
        "bos_token_id": info.endoftext_token_id,
        "eos_token_id": info.eos_token_id,
        "pad_token_id": info.pad_token_id,
    }


def target_recipe() -> dict[str, Any]:
    """Everything the tiny target depends on; its hash names the cache entry."""
    import torch
    import transformers

    return {
        "kind": "tiny-target",
        "version": _RECIPE_VERSION,
        "tokenizer": recipe_hash(tokenizer_recipe()),
        "config": target_config_dict(),
        "train": _TRAIN,
        # Weights depend on the kernels' numerics; a new torch may train a different model.
        "torch": torch.__version__.split("+")[0],
        "transformers": transformers.__version__,
    }


def tiny_target_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the tiny target lives in the cache (it may not be built yet)."""
    return cache_root(cache_dir) / "assets" / f"tiny-target-{recipe_hash(target_recipe())}"


def build_tiny_target(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Build (or find cached) the tiny target; return its HF folder (model + tokenizer files)."""
    tokenizer_dir = build_tiny_tokenizer(cache_dir)
    return build_once(tiny_target_dir(cache_dir), lambda tmp: _pretrain_into(tmp, tokenizer_dir))


def _pretrain_into(folder: Path, tokenizer_dir: Path) -> None:
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen3Config, Qwen3ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    started = time.perf_counter()
    threads = torch.get_num_threads()
    # One thread whatever the machine: the weights do not depend on its core count, and a tiny
    # model gains little from a second thread that other processes (parallel tests) may be using.
    torch.set_num_threads(1)
    try:
        torch.manual_seed(_TRAIN["seed"])
        config = Qwen3Config(**target_config_dict())
        model = Qwen3ForCausalLM(config)
        losses = _pretrain(model, _token_stream(tokenizer), torch)
    finally:
        torch.set_num_threads(threads)
    model.generation_config = GenerationConfig(
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id,
        do_sample=False,
    )
    model.save_pretrained(str(folder), safe_serialization=True)
    for name in os.listdir(tokenizer_dir):
        if name != INFO_FILE:
            (folder / name).write_bytes((tokenizer_dir / name).read_bytes())
    report = {
        "recipe": target_recipe(),
        "parameters": sum(p.numel() for p in model.parameters()),
        "build_seconds": round(time.perf_counter() - started, 1),
        "loss_first": round(losses[0], 3),
        "loss_last": round(sum(losses[-10:]) / len(losses[-10:]), 3),
    }
    (folder / INFO_FILE).write_text(json.dumps(report, indent=2, sort_keys=True), encoding="utf-8")


def _token_stream(tokenizer: Any) -> list[int]:
    """The pretraining slice rendered with the chat template, conversations joined by
    <|endoftext|> as in pretraining."""
    first, count = _TRAIN["records"]
    stream: list[int] = []
    for messages in sharegpt_conversations(first, count):
        text = tokenizer.apply_chat_template(messages, tokenize=False)
        if len(text) > _TRAIN["max_chars"]:
            continue
        stream.extend(tokenizer.backend_tokenizer.encode(text, add_special_tokens=False).ids)
        stream.append(tokenizer.pad_token_id)
    return stream


def _pretrain(model: Any, stream: list[int], torch: Any) -> list[float]:
    """Next-token training on random windows of the stream; returns the loss per step."""
    seq, batch, steps = _TRAIN["seq_len"], _TRAIN["batch_size"], _TRAIN["steps"]
    data = torch.tensor(stream, dtype=torch.long)
    generator = torch.Generator().manual_seed(_TRAIN["seed"])
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=_TRAIN["lr"], weight_decay=_TRAIN["weight_decay"]
    )
    warmup = _TRAIN["warmup"]

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    model.train()
    losses: list[float] = []
    for _ in range(steps):
        starts = torch.randint(0, len(data) - seq, (batch,), generator=generator)
        windows = torch.stack([data[s : s + seq] for s in starts.tolist()])
        # HF shifts the labels by one inside the loss.
        out = model(input_ids=windows, labels=windows)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(out.loss.detach()))
    model.eval()
    return losses
