"""The tiny tokenizer: a byte-level BPE trained offline on a fixed slice of the ShareGPT package.

It behaves like Qwen's where the pipeline can tell: byte-level BPE behind Qwen's pre-split
pattern, NFC normalisation, special tokens `<|endoftext|>` (pad, pretraining eos), `<|im_start|>`,
`<|im_end|>` (chat eos) appended after the vocabulary, plus `<|mask|>` reserved for the draft's
mask_token_id, and the Qwen chat template attached. Built once per recipe and cached.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ..data.chat_template import QWEN_CHAT_TEMPLATE
from ..runtime.cache import build_once, cache_root, recipe_hash
from .corpus import sharegpt_texts
from .info import ENDOFTEXT, IM_END, IM_START, MASK, SPECIAL_TOKENS, TINY_VOCAB_SIZE
from .info import special_token_id as _special_id

# Qwen2's pre-tokenizer split: digits one by one, letters with one leading non-letter,
# punctuation runs with their trailing newlines, newline runs, then spaces.
QWEN_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# The training slice: the first records of the package, up to this many characters.
_SLICE_RECORDS = 3000
_SLICE_MAX_CHARS = 4_000_000
_RECIPE_VERSION = 1
INFO_FILE = "specdraft_assets.json"


def tokenizer_recipe() -> dict[str, object]:
    """Everything the tiny tokenizer depends on; its hash names the cache entry."""
    import tokenizers

    from ..data.sharegpt import sharegpt_package_version

    return {
        "kind": "tiny-tokenizer",
        "version": _RECIPE_VERSION,
        "slice": [0, _SLICE_RECORDS, _SLICE_MAX_CHARS],
        "vocab_size": TINY_VOCAB_SIZE,
        "special_tokens": list(SPECIAL_TOKENS),
        "pattern": QWEN_SPLIT_PATTERN,
        "chat_template": QWEN_CHAT_TEMPLATE,
        # BPE training is deterministic for one tokenizers release; a new release may differ.
        "tokenizers": tokenizers.__version__,
        "sharegpt": sharegpt_package_version(),
    }


def tiny_tokenizer_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where the tiny tokenizer lives in the cache (it may not be built yet)."""
    return cache_root(cache_dir) / "assets" / f"tiny-tokenizer-{recipe_hash(tokenizer_recipe())}"


def build_tiny_tokenizer(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Build (or find cached) the tiny tokenizer; return its HF folder for AutoTokenizer."""
    return build_once(tiny_tokenizer_dir(cache_dir), _train_into)


def _train_into(folder: Path) -> None:
    tokenizer = train_tiny_tokenizer()
    tokenizer.save_pretrained(str(folder))
    _portable_config(folder / "tokenizer_config.json")
    (folder / INFO_FILE).write_text(
        json.dumps({"recipe": tokenizer_recipe()}, indent=2, sort_keys=True), encoding="utf-8"
    )


def train_tiny_tokenizer():  # -> PreTrainedTokenizerFast
    """Train the byte-level BPE on the ShareGPT slice and wrap it as a HF fast tokenizer."""
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast

    texts = sharegpt_texts(0, _SLICE_RECORDS, _SLICE_MAX_CHARS)
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    bpe.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE - len(SPECIAL_TOKENS),
        min_frequency=2,
        show_progress=False,
        # All 256 byte symbols, so no input is ever unknown.
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(texts, trainer)
    # Special tokens go after the learned vocabulary (Qwen's layout); never normalised or split.
    bpe.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    for token in SPECIAL_TOKENS:
        if bpe.token_to_id(token) != _special_id(token):
            raise RuntimeError(
                f"tiny tokenizer: {token} got id {bpe.token_to_id(token)}, expected "
                f"{_special_id(token)}; the BPE did not fill its {TINY_VOCAB_SIZE} entries"
            )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token=None,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        mask_token=MASK,
        additional_special_tokens=[IM_START],
        model_max_length=32768,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = QWEN_CHAT_TEMPLATE
    return tokenizer


def _portable_config(path: Path) -> None:
    # transformers 5 writes its own backend class name; the generic fast-tokenizer class loads
    # the same tokenizer.json in transformers 4 and 5 alike.
    config = json.loads(path.read_text(encoding="utf-8"))
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n", encoding="utf-8")
