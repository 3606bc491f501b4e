#!/usr/bin/env bash
# Create build/specforge-venv: SpecForge 0.2.0 (the SGLang project's draft trainer: DFlash and
# DSpark) on top of the environment that calls this script, for bench/peers.py, which times
# specdraft's training step against SpecForge's own classes on identical weights and batches.
#
#   scripts/specforge_venv.sh [VENV]   (default build/specforge-venv; PYTHON: the interpreter whose
#                                       packages the venv reuses, default python3; it needs the
#                                       CPU torch 2.13 and transformers, e.g. .venv/bin/python)
#
# specforge 0.2.0 pins torch==2.11.0, transformers==5.8.1 and sglang==0.5.14 (CUDA builds, GBs),
# so it goes in --no-deps: its modelling and training-wrapper modules (specforge.modeling.draft,
# specforge.algorithms.common.dflash_family_model) import only torch, transformers,
# huggingface_hub, safetensors, numpy, tqdm and pyyaml, which the reused environment provides
# (its CPU torch 2.13 and its transformers run SpecForge's DFlash and DSpark classes; flash_attn
# is optional there and missing here, which SpecForge reports with a warning). A .pth file adds
# the reused environment's packages after the venv's own; pip skips each listed package that
# environment already has. A few MB instead of SpecForge's CUDA stack.
# A venv whose stamp matches this script, venv_lock.sh and the reused environment is kept.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv_lock.sh
VENV="${1:-build/specforge-venv}"
PYTHON="${PYTHON:-python3}"
SPECFORGE_VERSION="0.2.0"
venv_lock "$VENV"

if ! BASE="$("$PYTHON" -c 'import sysconfig, torch, transformers; print(sysconfig.get_paths()["purelib"]); print(torch.__version__, transformers.__version__)')"; then
  echo "specforge_venv.sh: $PYTHON cannot import torch and transformers; run make setup, then" \
    "PYTHON=.venv/bin/python $0" >&2
  exit 1
fi
BASE_SITE="$(sed -n 1p <<<"$BASE")"
BASE_TORCH="$(sed -n 2p <<<"$BASE" | cut -d' ' -f1)"
if [[ "$BASE_TORCH" != *+cpu ]]; then
  echo "specforge_venv.sh: $PYTHON has torch $BASE_TORCH, not the CPU build (torch==2.13.0+cpu)" >&2
  exit 1
fi
want="$(cat "$0" scripts/venv_lock.sh <(echo "$BASE") | sha256sum | cut -d' ' -f1)"
if venv_current "$VENV" "$want"; then
  exit 0
fi

# What SpecForge's modelling imports besides torch and transformers (skipped when present).
PURE=(huggingface-hub safetensors numpy tqdm pyyaml packaging typing-extensions)

rm -rf "$VENV"
"$PYTHON" -m venv --without-pip "$VENV"
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "import site; site.addsitedir('$BASE_SITE')" >"$SITE/zz-specdraft-reuse.pth"
pip=("$PYTHON" -m pip --python "$VENV/bin/python" install -q --disable-pip-version-check)
"${pip[@]}" --no-deps "specforge==$SPECFORGE_VERSION" "${PURE[@]}"
"$VENV/bin/python" -c "import torch; assert torch.__version__.endswith('+cpu'), torch.__version__"
"$VENV/bin/python" -W ignore -c "
from specforge.algorithms.common.dflash_family_model import OnlineDFlashModel, OnlineDSparkModel
from specforge.modeling.draft.dflash import DFlashDraftModel
from specforge.modeling.draft.dspark import DSparkDraftModel
print('specforge $SPECFORGE_VERSION')"
venv_stamp "$VENV" "$want"
