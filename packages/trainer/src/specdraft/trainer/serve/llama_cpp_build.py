"""Where the pinned llama.cpp build lives (scripts/llama_cpp_build.sh): `LlamaCpp`,
`find_llama_cpp`, `require_llama_cpp`, `ensure_llama_cpp` and their constants.

The lookup is `specdraft.trainer.runtime.llama_cpp`, named here under serve as before: the GGUF
export (export/gguf.py) needs the converter too, and serve imports export, so the lookup sits
below both.
"""

from __future__ import annotations

from ..runtime.llama_cpp import (
    BUILD_NUMBER,
    BUILD_SCRIPT,
    ENV_VAR,
    LlamaCpp,
    LlamaCppUnavailable,
    ensure_llama_cpp,
    find_llama_cpp,
    repository_root,
    require_llama_cpp,
)

__all__ = [
    "BUILD_NUMBER",
    "BUILD_SCRIPT",
    "ENV_VAR",
    "LlamaCpp",
    "LlamaCppUnavailable",
    "ensure_llama_cpp",
    "find_llama_cpp",
    "repository_root",
    "require_llama_cpp",
]
