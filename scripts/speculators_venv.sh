#!/usr/bin/env bash
# Create build/speculators-venv: speculators==0.9.0 (vLLM's drafter format and library) layered
# on the vLLM CPU venv, for the tests that load a `specdraft export --format speculators` folder
# with speculators' own model classes.
#
#   scripts/speculators_venv.sh [VENV]   (default build/speculators-venv; VLLM_VENV: the venv
#                                         it reuses, default build/vllm-venv, built first by
#                                         scripts/vllm_cpu_venv.sh when missing or stale)
#
# speculators 0.9.0 pins transformers<=5.19.0; the vLLM venv has exactly 5.19.0, the CPU torch
# 2.13 and every other package speculators imports except `datasets` (imported by its training
# data module, which its package __init__ reaches) and hs-connectors (the same module's; it needs
# only torch and safetensors). So speculators and hs-connectors go in --no-deps (speculators'
# declared torchvision/torchaudio would pull builds that do not load beside the CPU torch),
# datasets with its own dependencies; a .pth file
# adds the vLLM venv's packages after this venv's own. About 150 MB instead of a second 3.4 GB.
# Like the vLLM venv it is built once per machine in the venv cache
# (~/.cache/specdraft/speculators-venv-HASH, scripts/venv_lock.sh) and VENV links to it; a cached
# venv whose stamp matches this script and the vLLM venv's stamp is linked and kept.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/venv_lock.sh
VENV="${1:-build/speculators-venv}"
VLLM_VENV="${VLLM_VENV:-build/vllm-venv}"
SPECULATORS_VERSION="0.9.0"

# The reused venv first (a no-op when its stamp is current; waits while `make test` builds it).
bash scripts/vllm_cpu_venv.sh "$VLLM_VENV"
# The cached vLLM venv's own folder, not the clone's link to it: the .pth below and the hash name
# it, so every clone shares one speculators venv.
BASE_SITE="$(realpath "$("$VLLM_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')")"
want="$(cat "$0" scripts/venv_lock.sh "$VLLM_VENV/.specdraft-stamp" <(echo "$BASE_SITE") | sha256sum | cut -d' ' -f1)"
if venv_from_cache speculators-venv "$want" "$VENV"; then
  exit 0
fi

# The stamp is written last: a half-built venv is rebuilt from scratch on the next call.
VENV_LINK="$VENV"
VENV="$CACHED"
"$VLLM_VENV/bin/python" -m venv --without-pip "$VENV"
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "import site; site.addsitedir('$BASE_SITE')" >"$SITE/zz-specdraft-reuse.pth"
pip=("$VLLM_VENV/bin/python" -m pip --python "$VENV/bin/python" install -q --disable-pip-version-check)
"${pip[@]}" --no-deps "speculators==$SPECULATORS_VERSION" "hs-connectors==$SPECULATORS_VERSION"
# Its declared range; pip skips what the vLLM venv already provides.
"${pip[@]}" "datasets>=4.0.0,<=5.1.0"
"$VENV/bin/python" -c "import torch; assert torch.__version__.endswith('+cpu'), torch.__version__"
"$VENV/bin/python" -c "
import transformers
from speculators.models.dflash import DFlashDraftModel
from speculators.models.dflash2 import DFlash2DraftModel
from speculators.models.dspark import DSparkDraftModel
print('speculators $SPECULATORS_VERSION on transformers', transformers.__version__)"
venv_stamp "$VENV" "$want"
venv_link "$VENV_LINK" "$VENV"
