#!/usr/bin/env bash
# Create build/sglang-venv: the released sglang==0.5.23 (installed --no-deps, never its CUDA
# torch==2.14.1) on top of the environment that calls this script, whose CPU torch 2.13 build,
# numpy, pydantic, requests, aiohttp, ... a .pth file adds after the venv's own packages. Only
# what that environment lacks goes into the venv: sglang itself, the few pure-Python packages
# that `sglang.srt.server_args` and `sglang.srt.arg_groups.validation_hook` import, triton
# (imported at the top of sglang.srt.utils.common), and the specdraft SGLang plugin. Enough to
# run SGLang's own argument parser and validation hooks and its plugin discovery on a CPU
# machine; not enough to serve a model. About 1.3 GB (triton is 1 GB of it) instead of the
# 2.3 GB of a venv with its own torch and its own copies of the shared packages.
#
#   scripts/sglang_venv.sh [VENV]   (default build/sglang-venv; PYTHON: the interpreter whose
#                                    packages the venv reuses, default python3; it needs the
#                                    CPU torch and pip, e.g. .venv/bin/python after make setup)
#
# The list below was found by trying: import, read the ModuleNotFoundError, add that package.
# A venv whose stamp matches this script, the plugin and the reused environment is kept as is.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv_lock.sh
VENV="${1:-build/sglang-venv}"
PYTHON="${PYTHON:-python3}"
# One build at a time: `make test` starts one in the background while the tests run, and the
# SGLang tests' own call waits here for it to finish, then finds its stamp.
venv_lock "$VENV"

# The reused environment: its site-packages, and its torch, which must be the CPU build.
if ! BASE="$("$PYTHON" -c 'import sysconfig, torch; print(sysconfig.get_paths()["purelib"]); print(torch.__version__)')"; then
  echo "sglang_venv.sh: $PYTHON cannot import torch; run make setup, then" \
    "PYTHON=.venv/bin/python $0" >&2
  exit 1
fi
BASE_SITE="$(sed -n 1p <<<"$BASE")"
BASE_TORCH="$(sed -n 2p <<<"$BASE")"
if [[ "$BASE_TORCH" != *+cpu ]]; then
  echo "sglang_venv.sh: $PYTHON has torch $BASE_TORCH, not the CPU build (torch==2.13.0+cpu)" >&2
  exit 1
fi

want="$(cat "$0" scripts/venv_lock.sh packages/sglang-plugin/pyproject.toml packages/sglang-plugin/src/specdraft_sglang_plugin/*.py <(echo "$BASE") | sha256sum | cut -d' ' -f1)"
if venv_current "$VENV" "$want"; then
  exit 0
fi

# Imported by sglang/__init__, sglang.srt.utils.common and server_args at import time. pip
# skips each one the reused environment already has (it sees that environment through the
# .pth file), so in practice only orjson, psutil, pybase64, starlette, msgspec, pyzmq,
# ipython, traitlets and triton are installed here.
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
# No pip of its own: the calling environment's pip installs into it (pip --python).
"$PYTHON" -m venv --without-pip "$VENV"
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
# addsitedir (not a bare path line) so the reused environment's own .pth files (editable
# installs, setuptools' distutils shim) apply too; it appends, so the venv's packages win.
echo "import site; site.addsitedir('$BASE_SITE')" >"$SITE/zz-specdraft-reuse.pth"
pip=("$PYTHON" -m pip --python "$VENV/bin/python" install -q --disable-pip-version-check)
"${pip[@]}" --no-deps "sglang==0.5.23" "${PURE[@]}"
# pydantic with its deps, so pydantic-core matches the pydantic version exactly (a no-op when
# the reused environment has it, as specdraft-config requires it).
"${pip[@]}" pydantic
# SGLang finds the plugin through its sglang.srt.plugins entry point.
"${pip[@]}" --no-deps ./packages/sglang-plugin
"$VENV/bin/python" -c "import torch; assert torch.__version__.endswith('+cpu'), torch.__version__"
"$VENV/bin/python" -c "import sglang.srt.server_args, sglang.srt.arg_groups.validation_hook"
venv_share_files "$VENV"
venv_stamp "$VENV" "$want"
