#!/usr/bin/env bash
# Create build/sglang-venv: the released sglang==0.5.23 (installed --no-deps, never its CUDA
# torch==2.14.1) next to the CPU torch 2.13 build, plus the few pure-Python packages that
# `sglang.srt.server_args` and `sglang.srt.arg_groups.validation_hook` import, and the
# specdraft SGLang plugin. Enough to run SGLang's own argument parser and validation hooks and
# its plugin discovery on a CPU machine; not enough to serve a model.
#
#   scripts/sglang_venv.sh [VENV]     (default build/sglang-venv; PYTHON picks the interpreter)
#
# The list below was found by trying: import, read the ModuleNotFoundError, add that package.
# A venv whose stamp matches this script is reused as is.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-build/sglang-venv}"
PYTHON="${PYTHON:-python3}"
STAMP="$VENV/.specdraft-stamp"
want="$(cat "$0" packages/sglang-plugin/pyproject.toml packages/sglang-plugin/src/specdraft_sglang_plugin/*.py | sha256sum | cut -d' ' -f1)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$want" ]; then
  exit 0
fi

# Imported by sglang/__init__, sglang.srt.utils.common and server_args at import time.
PURE=(
  numpy orjson psutil pybase64 packaging pillow tqdm
  requests urllib3 idna charset-normalizer certifi
  starlette anyio msgspec pyzmq
  ipython traitlets pygments
  aiohttp multidict attrs yarl propcache aiohappyeyeballs aiosignal frozenlist
  # sglang.srt.utils.common does `import triton` at the top (pure Python plus a compiler
  # binary; no CUDA runtime is pulled or needed to import it).
  triton
)

# The stamp is written last: a half-built venv is rebuilt from scratch on the next call.
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
# The CPU build first, with its own small dependencies: nothing below may replace it.
"${pip[@]}" "torch==2.13.0"
"${pip[@]}" --no-deps "sglang==0.5.23" "${PURE[@]}"
# pydantic with its deps, so pydantic-core matches the pydantic version exactly.
"${pip[@]}" pydantic
# SGLang finds the plugin through its sglang.srt.plugins entry point.
"${pip[@]}" --no-deps ./packages/sglang-plugin
"$VENV/bin/python" -c "import torch; assert torch.__version__.endswith('+cpu'), torch.__version__"
"$VENV/bin/python" -c "import sglang.srt.server_args, sglang.srt.arg_groups.validation_hook"
echo "$want" > "$STAMP"
