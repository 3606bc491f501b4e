"""The fixed layout of the tiny assets: token ids and target sizes, known without building them.

The special tokens are appended after the BPE vocabulary, as in Qwen, so their ids follow from
the vocabulary size alone; `build_tiny_tokenizer` checks that the built tokenizer agrees.
"""

from __future__ import annotations

from dataclasses import dataclass

TINY_VOCAB_SIZE = 4096

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
MASK = "<|mask|>"
# Order matters: ids are TINY_VOCAB_SIZE - len(SPECIAL_TOKENS) + position.
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, MASK)

TARGET_HIDDEN_SIZE = 128
TARGET_NUM_LAYERS = 4
TARGET_NUM_HEADS = 4
TARGET_NUM_KV_HEADS = 2
TARGET_HEAD_DIM = 32
TARGET_INTERMEDIATE_SIZE = 384


def special_token_id(token: str) -> int:
    """Id of one of the tiny tokenizer's special tokens."""
    return TINY_VOCAB_SIZE - len(SPECIAL_TOKENS) + SPECIAL_TOKENS.index(token)


@dataclass(frozen=True)
class TinyAssetsInfo:
    """Ids and sizes of the tiny tokenizer and target, for configs and tests."""

    vocab_size: int
    pad_token_id: int
    eos_token_id: int
    endoftext_token_id: int
    im_start_token_id: int
    mask_token_id: int
    target_hidden_size: int
    target_num_layers: int
    target_num_heads: int
    target_num_kv_heads: int


def tiny_assets_info() -> TinyAssetsInfo:
    """The tiny assets' ids (mask, chat eos = <|im_end|>, pad = <|endoftext|>) and target sizes."""
    return TinyAssetsInfo(
        vocab_size=TINY_VOCAB_SIZE,
        pad_token_id=special_token_id(ENDOFTEXT),
        eos_token_id=special_token_id(IM_END),
        endoftext_token_id=special_token_id(ENDOFTEXT),
        im_start_token_id=special_token_id(IM_START),
        mask_token_id=special_token_id(MASK),
        target_hidden_size=TARGET_HIDDEN_SIZE,
        target_num_layers=TARGET_NUM_LAYERS,
        target_num_heads=TARGET_NUM_HEADS,
        target_num_kv_heads=TARGET_NUM_KV_HEADS,
    )
