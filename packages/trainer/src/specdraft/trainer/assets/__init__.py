"""Tiny local assets for tests and the quickstart: a BPE tokenizer and a Qwen3 target, built
offline from the ShareGPT package and cached (no model hub)."""

from .info import TinyAssetsInfo, tiny_assets_info
from .target import build_tiny_target
from .tokenizer import build_tiny_tokenizer

__all__ = [
    "TinyAssetsInfo",
    "build_tiny_target",
    "build_tiny_tokenizer",
    "tiny_assets_info",
]
