"""Where the pinned llama.cpp build lives: its source tree (the GGUF converter, gguf-py) and its
binaries (`llama-server`, `llama-bench`), built once by scripts/llama_cpp_build.sh.

Looked up, in order: `$SPECDRAFT_LLAMA_CPP` (a folder laid out like the cache: the llama.cpp
source tree with `build/bin/llama-server`), the checkout's `build/llama.cpp` link, and the cache
folder the build script prints. `ensure_llama_cpp()` builds it when none is found.

A runtime piece, not a serve one: the GGUF export (export/, which serve imports) runs the
tree's converter, and serve runs its binaries; `serve/llama_cpp_build.py` names the same API.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

BUILD_SCRIPT = "scripts/llama_cpp_build.sh"
BUILD_NUMBER = 11434
ENV_VAR = "SPECDRAFT_LLAMA_CPP"


class LlamaCppUnavailable(RuntimeError):
    """No llama.cpp build was found (or the one named is incomplete); says how to build one."""


@dataclass(frozen=True)
class LlamaCpp:
    """One llama.cpp build: its tree and the files specdraft uses from it."""

    home: Path

    @property
    def server(self) -> Path:
        """The `llama-server` binary."""
        return self.home / "build" / "bin" / "llama-server"

    @property
    def bench(self) -> Path:
        """The `llama-bench` binary."""
        return self.home / "build" / "bin" / "llama-bench"

    @property
    def converter(self) -> Path:
        """llama.cpp's own HF -> GGUF converter script."""
        return self.home / "convert_hf_to_gguf.py"

    @property
    def gguf_py(self) -> Path:
        """The tree's gguf-py package (put on PYTHONPATH for the converter)."""
        return self.home / "gguf-py"

    @property
    def build_number(self) -> int:
        """The llama.cpp build number (recorded by the build script in `.built`)."""
        stamp = self.home / ".built"
        if stamp.is_file() and stamp.read_text().strip().isdigit():
            return int(stamp.read_text().strip())
        return BUILD_NUMBER


def repository_root() -> Path | None:
    """The specdraft checkout this package runs from (editable install), if it is one."""
    for folder in Path(__file__).resolve().parents:
        if (folder / BUILD_SCRIPT).is_file():
            return folder
    return None


def _complete(home: Path) -> bool:
    return (home / "build" / "bin" / "llama-server").is_file() and (
        home / "convert_hf_to_gguf.py"
    ).is_file()


def find_llama_cpp() -> LlamaCpp | None:
    """The first complete llama.cpp build of the lookup order (see module), or None."""
    named = os.environ.get(ENV_VAR)
    if named:
        if not _complete(Path(named)):
            raise LlamaCppUnavailable(
                f"${ENV_VAR}={named} is not a llama.cpp build (no build/bin/llama-server or "
                f"convert_hf_to_gguf.py there); unset it, or build one with `bash {BUILD_SCRIPT}`"
            )
        return LlamaCpp(Path(named))
    candidates = [Path.cwd() / "build" / "llama.cpp"]
    root = repository_root()
    if root is not None:
        candidates.append(root / "build" / "llama.cpp")
    for candidate in candidates:
        if _complete(candidate):
            return LlamaCpp(candidate.resolve())
    if root is not None:
        printed = subprocess.run(
            ["bash", str(root / BUILD_SCRIPT), "--print"], capture_output=True, text=True
        )
        home = Path(printed.stdout.strip()) if printed.returncode == 0 else None
        if home is not None and _complete(home):
            return LlamaCpp(home)
    return None


def require_llama_cpp() -> LlamaCpp:
    """The llama.cpp build, or LlamaCppUnavailable naming the command that builds it."""
    found = find_llama_cpp()
    if found is None:
        raise LlamaCppUnavailable(
            f"no llama.cpp build found (looked at ${ENV_VAR}, build/llama.cpp and the cache); "
            f"build it once with `bash {BUILD_SCRIPT}` (about 8 minutes on 2 cores), or set "
            f"{ENV_VAR} to a llama.cpp tree with build/bin/llama-server"
        )
    return found


def ensure_llama_cpp() -> LlamaCpp:
    """The llama.cpp build, built by the repository's script first when none is found."""
    found = find_llama_cpp()
    if found is not None:
        return found
    root = repository_root()
    if root is None:
        return require_llama_cpp()
    done = subprocess.run(["bash", str(root / BUILD_SCRIPT)], cwd=root)
    if done.returncode != 0:
        raise LlamaCppUnavailable(f"`bash {BUILD_SCRIPT}` failed (exit {done.returncode})")
    return require_llama_cpp()
