#!/usr/bin/env bash
# The GPU preset of the static-shape benchmark, in one command, within ten minutes on one GPU.
#
#   bash bench/run_gpu.sh OUT_DIR [more bench/static_shapes.py options]
#
# Writes OUT_DIR/tables.md (the markdown tables, rewritten after every run), results.json,
# bench.log and, when time is left, OUT_DIR/probe/ (bench/step_vs_length.py at the gpu preset). The GPU machine reaches no package registry: run `bash bench/gpu_wheels.sh` here
# first and carry the `.whl` folder it fills (pydantic and tomli for the config package). The
# four packages are installed editable with no dependency resolution, against the machine's own
# torch; where pip cannot build them (no hatchling there) they are put on PYTHONPATH instead.
#
# Runs are ordered so that a time-budget cut drops the least needed rows: the `long` workload
# (the reference's 1024-8192 table) first, then `low-supervision` (the anchor buckets' workload),
# then `variable`; within each, fsdp2 / static+compile / buckets+compile and their anchor-bucket
# rows (static / buckets + anchor buckets + compile) before the uncompiled rows. The
# budget (BENCH_TIME_BUDGET seconds, default 480) counts from the harness's start; a run that
# would overrun it is stopped and shown as such. On a CPU, `--preset toy` checks this script.
set -euo pipefail
OUT=${1:?usage: bash bench/run_gpu.sh OUT_DIR [static_shapes.py options]}
shift
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
BUDGET=${BENCH_TIME_BUDGET:-480}
WORK=${BENCH_WORK_DIR:-/tmp/specdraft-bench}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$ROOT"
exec > >(tee "$OUT/bench.log") 2>&1
echo "== specdraft GPU benchmark: $(date -u +%FT%TZ), budget ${BUDGET} s, work dir $WORK"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version \
    --format=csv,noheader || echo "(no nvidia-smi)"

# 1. Carried wheels for what the image lacks (pydantic, tomli), into a private site folder.
if ! "$PY" -c "import pydantic, tomli" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/specdraft-site .whl/*.whl
    export PYTHONPATH="/tmp/specdraft-site${PYTHONPATH:+:$PYTHONPATH}"
fi

# 2. The four packages against the machine's torch: never let pip resolve (or replace) torch.
if ! "$PY" -m pip install -q --no-deps --no-build-isolation --no-index \
    -e packages/config -e packages/collate -e packages/trainer -e packages/cli 2>/dev/null; then
    echo "(pip cannot build the packages here; using them from source via PYTHONPATH)"
    SRC="$ROOT/packages/config/src:$ROOT/packages/collate/src:$ROOT/packages/trainer/src"
    export PYTHONPATH="$SRC:$ROOT/packages/cli/src${PYTHONPATH:+:$PYTHONPATH}"
fi

# 3. Fail early, and say what is missing, rather than in the middle of the first run.
"$PY" - <<'PYCHECK'
import importlib, sys
missing = []
for name in ("torch", "pydantic", "tomli", "transformers", "safetensors", "tqdm"):
    try:
        importlib.import_module(name)
    except ImportError as exc:
        missing.append(f"{name} ({exc})")
if missing:
    sys.exit("missing Python packages: " + ", ".join(missing)
             + "\nrun `bash bench/gpu_wheels.sh` on a machine with a registry and carry .whl")
import torch, transformers
import specdraft.trainer.train.assembly  # noqa: F401 - the whole import chain the runs need
print(f"torch {torch.__version__} (cuda {torch.version.cuda}, available "
      f"{torch.cuda.is_available()}), transformers {transformers.__version__}")
PYCHECK

# 4. The benchmark. Inductor's cache is shared by the runs, so a shape compiled once (say the
#    max_length graph of static_shapes) is reused by the bucket runs.
export TORCHINDUCTOR_CACHE_DIR="$WORK/inductor-cache"
export PYTHONUNBUFFERED=1
"$PY" bench/static_shapes.py --preset gpu --out "$OUT" --work-dir "$WORK" \
    --time-budget "$BUDGET" "$@"

# 5. With time left under the ten minutes, the in-process probe: how much of a step at these
#    sizes grows with the padded length (the ceiling of what buckets can save, see
#    docs/benchmarks.md), t(L, A) over the preset's anchor widths, and static against static +
#    anchor buckets on low-supervision micro-batches. Same stand-in target; a cut probe loses
#    nothing above.
LEFT=$((570 - SECONDS))
if ! "$PY" -c "import torch, sys; sys.exit(not torch.cuda.is_available())"; then
    echo "== probe skipped: no CUDA device (the gpu preset's probe needs one)"
elif [ "$LEFT" -ge 60 ]; then
    echo "== probe: train compute against padded length (${LEFT} s left)"
    timeout "$LEFT" "$PY" bench/step_vs_length.py --preset gpu --rounds 5 --work-dir "$WORK" \
        --anchor-widths 128,256,512 --anchor-batches 6 --anchor-workload low-supervision \
        --out "$OUT/probe" || echo "(the probe did not finish in ${LEFT} s)"
else
    echo "== probe skipped: ${LEFT} s left"
fi
