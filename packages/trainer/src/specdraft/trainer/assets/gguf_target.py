"""A real target as a local asset: the Hugging Face folder of a GGUF model, built once and cached.

transformers reads a GGUF file (Llama, Qwen and the other families it knows) and dequantizes
it, but refuses to save that model; so the weights are loaded into a fresh model of the same
config, saved as safetensors with the tokenizer (and its chat template) and a generation
config whose eos is the chat turn's end token. The build compares the greedy answer of the saved
folder with the GGUF-loaded model's and publishes nothing on a mismatch. No model hub: every
load is local.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

from ..runtime.cache import build_once, cache_root, file_digest, recipe_hash
from .tokenizer import INFO_FILE

GGUF_MAGIC = b"GGUF"
_RECIPE_VERSION = 1
# The equality check: a fixed chat prompt whose answer is long enough to fill the new tokens.
CHECK_MESSAGES = [{"role": "user", "content": "Write a short poem about the sea."}]
CHECK_NEW_TOKENS = 24
# Keys of the GGUF-loaded config that describe the quantized checkpoint or are set again by
# the fresh config class, not the model.
_DROPPED_CONFIG_KEYS = ("quantization_config", "architectures", "transformers_version", "dtype")


class GgufTargetError(RuntimeError):
    """A GGUF file that cannot become a target, a missing dependency or a failed check."""


def build_target_from_gguf(
    gguf_file: str | os.PathLike[str], cache_dir: str | os.PathLike[str] | None = None
) -> Path:
    """Build (or find cached) the HF folder of a GGUF model; return it (model + tokenizer)."""
    path = _checked_gguf(gguf_file)
    _require_gguf_extra()
    recipe = _recipe(path)
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", path.stem)
    final = cache_root(cache_dir) / "assets" / f"gguf-{stem}-{recipe_hash(recipe)}"
    return build_once(final, lambda tmp: _build_into(tmp, path, recipe))


def _checked_gguf(gguf_file: str | os.PathLike[str]) -> Path:
    """The path, after checking it names a GGUF file (by its magic bytes, not its name)."""
    path = Path(gguf_file).expanduser().resolve()
    if not path.is_file():
        raise GgufTargetError(f"{path}: no such file; pass the path of a .gguf model file")
    with open(path, "rb") as handle:
        magic = handle.read(len(GGUF_MAGIC))
    if magic != GGUF_MAGIC:
        raise GgufTargetError(
            f"{path} is not a GGUF file (it does not start with {GGUF_MAGIC!r}); pass a .gguf "
            "model file (a GGUF release of the model, or llama.cpp's convert_hf_to_gguf.py output)"
        )
    return path


def _require_gguf_extra() -> None:
    """transformers reads GGUF files only with `gguf` (and `accelerate`) installed."""
    missing = [name for name in ("gguf", "accelerate") if importlib.util.find_spec(name) is None]
    if missing:
        raise GgufTargetError(
            f"building a target from a GGUF file needs the {' and '.join(missing)} package(s); "
            "install them with `pip install 'specdraft-trainer[gguf]'`"
        )


def _recipe(path: Path) -> dict[str, Any]:
    """Everything the built folder depends on; its hash names the cache entry."""
    from importlib.metadata import version

    return {
        "kind": "gguf-target",
        "version": _RECIPE_VERSION,
        "gguf_sha256": file_digest(path),
        # transformers maps the GGUF's keys and tensors; gguf dequantizes them.
        "transformers": version("transformers"),
        "gguf": version("gguf"),
    }


def _say(message: str) -> None:
    # stderr: a command's stdout keeps only its result line.
    print(f"gguf target: {message}", file=sys.stderr, flush=True)


def _build_into(folder: Path, path: Path, recipe: dict[str, Any]) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    started = time.perf_counter()
    _say(f"loading and dequantizing {path.name}")
    tokenizer, gguf_model = _load_gguf(path)
    eos = _turn_end_token_id(tokenizer, path)
    generation = GenerationConfig(
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos,
        bos_token_id=tokenizer.bos_token_id,
        do_sample=False,
    )
    gguf_model.generation_config = generation
    expected = greedy_answer(gguf_model, tokenizer, CHECK_MESSAGES)

    _say(f"saving {type(gguf_model).__name__} as safetensors")
    model = _fresh_copy(gguf_model)
    del gguf_model  # one fp32 copy at a time in memory
    model.generation_config = generation
    parameters = sum(p.numel() for p in model.parameters())
    model.save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))
    del model

    _say(f"checking the saved folder's greedy answer ({CHECK_NEW_TOKENS} tokens)")
    saved_tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    saved = AutoModelForCausalLM.from_pretrained(
        str(folder), local_files_only=True, dtype=torch.float32
    ).eval()
    prompt_ids = _prompt_ids(tokenizer)
    if _prompt_ids(saved_tokenizer) != prompt_ids:
        raise GgufTargetError(f"{path}: the saved tokenizer renders the check prompt differently")
    # With the saved folder's own generation config: what a user of the folder gets.
    answer = greedy_answer(saved, saved_tokenizer, CHECK_MESSAGES)
    if answer != expected:
        raise GgufTargetError(
            f"{path}: the saved folder answers {tokenizer.decode(answer)!r} where the GGUF model "
            f"answers {tokenizer.decode(expected)!r}; refusing to publish it"
        )
    report = {
        "recipe": recipe,
        "source": str(path),
        "parameters": parameters,
        "eos_token_id": eos,
        "build_seconds": round(time.perf_counter() - started, 1),
        "check": {
            "messages": CHECK_MESSAGES,
            "prompt_ids": prompt_ids,
            "answer_ids": answer,
            "answer": tokenizer.decode(answer),
        },
    }
    (folder / INFO_FILE).write_text(json.dumps(report, indent=2, sort_keys=True), encoding="utf-8")
    _say(f"built in {report['build_seconds']} s")


def _load_gguf(path: Path) -> tuple[Any, Any]:
    """The GGUF's tokenizer and dequantized fp32 model, or a refusal naming the file."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kwargs: dict[str, Any] = {"gguf_file": path.name, "local_files_only": True}
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), **kwargs)
        model = AutoModelForCausalLM.from_pretrained(
            str(path.parent), dtype=torch.float32, **kwargs
        ).eval()
    except (ValueError, KeyError, NotImplementedError) as exc:
        raise GgufTargetError(
            f"{path}: transformers {transformers.__version__} cannot load this GGUF as a causal "
            f"language model ({str(exc).rstrip('.')}); use a GGUF of an architecture it reads "
            "(Llama, Qwen2, Qwen3, Mistral, ...)"
        ) from exc
    if not tokenizer.chat_template:
        raise GgufTargetError(
            f"{path}: the GGUF has no chat template (tokenizer.chat_template); specdraft renders "
            "conversations with the target's own template, so use a chat (instruct) model"
        )
    return tokenizer, model


def _turn_end_token_id(tokenizer: Any, path: Path) -> int:
    """The token that ends an assistant turn in the chat template (<|im_end|> in ChatML).

    The GGUF's eos may be the document end (<|endoftext|>) rather than the turn end, and a
    greedy answer must stop at the turn end: so render an assistant turn and take the special
    token that follows its text."""
    sentinel = "SPECDRAFT_SENTINEL"
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}, {"role": "assistant", "content": sentinel}],
        tokenize=False,
    )
    tail = text.split(sentinel, 1)[1] if sentinel in text else ""
    ids = tokenizer.encode(tail, add_special_tokens=False)
    special = {i for i, token in tokenizer.added_tokens_decoder.items() if token.special}
    if ids and ids[0] in special:
        return int(ids[0])
    if tokenizer.eos_token_id is None:
        raise GgufTargetError(f"{path}: neither the chat template nor the GGUF names an eos token")
    return int(tokenizer.eos_token_id)


def _fresh_copy(gguf_model: Any) -> Any:
    """A plain (unquantized) model of the same config holding the dequantized weights."""
    from transformers import AutoConfig, AutoModelForCausalLM

    values = gguf_model.config.to_dict()
    model_type = values.pop("model_type")
    for key in _DROPPED_CONFIG_KEYS:
        values.pop(key, None)
    config = AutoConfig.for_model(model_type, **values)
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(gguf_model.state_dict())
    return model.eval()


def greedy_answer(
    model: Any, tokenizer: Any, messages: list[dict[str, str]], new_tokens: int = CHECK_NEW_TOKENS
) -> list[int]:
    """The model's greedy answer (token ids) to a chat rendered with the tokenizer's template."""
    import torch

    prompt = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )
    with torch.no_grad():
        out = model.generate(**prompt, max_new_tokens=new_tokens, do_sample=False)
    return [int(i) for i in out[0, prompt["input_ids"].shape[1] :].tolist()]


def _prompt_ids(tokenizer: Any) -> list[int]:
    text = tokenizer.apply_chat_template(CHECK_MESSAGES, add_generation_prompt=True, tokenize=False)
    return [int(i) for i in tokenizer(text, add_special_tokens=False)["input_ids"]]
