#!/usr/bin/env bash
# Fetch, here, the wheels the GPU machine lacks, for bench/run_gpu.sh to install there.
#
#   bash bench/gpu_wheels.sh          # -> .whl/ (ignored by git; carry it to the GPU machine)
#
# The GPU image has torch, transformers, safetensors, tokenizers, click and tqdm, but not the
# config package's pydantic and tomli, and it cannot reach a package registry. This downloads
# those (no dependencies resolved: each one is named) for its Python 3.12 on x86-64.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
PY=${PYTHON:-python3}
WHEELS=(
    "pydantic==2.14.4"
    "pydantic-core==2.50.5"
    "annotated-types==0.8.0"
    "typing-inspection==0.4.5"
    "typing-extensions==4.16.0"
    "tomli==2.5.0"
)
"$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "${WHEELS[@]}"
ls -la .whl
