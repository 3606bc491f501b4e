"""Shared test settings: caches under build/ so compiled graphs and tiny assets are reused, and
the order in which `pytest -n 2 --dist loadfile` (make test) hands test files to its workers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(ROOT / "build" / "inductor-cache"))
os.environ.setdefault("SPECDRAFT_CACHE", str(ROOT / "build" / "cache"))
# No model hub: every model and tokenizer in the tests is built locally.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# One intra-op thread per process (before anything imports torch): two test workers share two
# cores, and the tiny models' matmuls are too small to split; spinning OpenMP threads on busy
# cores cost several times the work. The launcher's ranks and services inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# The longest test files (measured on two cores from a cold cache), handed out first so that
# neither worker is left alone with a long file at the end; every other file follows in
# collection order. The order only changes wall time, never a result. The first entries are
# the mypy check (which needs no tiny target), the file that builds the tiny target while that
# runs, then the torch-free config and collate tests, so the other worker has work that does not
# wait for the target's build (build/cache, behind a lock).
FIRST = (
    "test_types.py",
    "integration/test_disaggregated_crash_resume.py",
    "config/",
    "collate/",
    "integration/test_distributed_compile.py",
    "integration/test_packing_compile.py",
    "integration/test_bench_packing.py",
    "integration/test_bench_smoke.py",
    "integration/test_disaggregated_managed.py",
    "integration/test_packing_disaggregated.py",
    "integration/test_quickstart.py",
    # After the longest files, so that `make test`'s background build of build/vllm-venv (about
    # five minutes cold) is done by then; the speculators file is short and stays last.
    "serve/test_serve_vllm.py",
    "integration/test_disaggregated_mooncake.py",
    "integration/test_disaggregated_restart.py",
    "integration/test_distributed_equivalence.py",
    "integration/test_packing_resume.py",
    "integration/test_packing_equivalence.py",
    "cli/test_train_cli.py",
)


def _rank(path: Path) -> int:
    """The position of a test file in FIRST (a folder entry covers its files), else last."""
    try:
        relative = path.resolve().relative_to(ROOT / "tests").as_posix()
    except ValueError:
        return len(FIRST)
    for index, entry in enumerate(FIRST):
        if relative == entry or (entry.endswith("/") and relative.startswith(entry)):
            return index
    return len(FIRST)


def pytest_collection_modifyitems(config, items):
    """Heavy files first (see FIRST); a stable sort keeps each file's tests in their order."""
    items.sort(key=lambda item: _rank(Path(str(item.path))))


@pytest.fixture(scope="session")
def tiny_target_path():
    """Folder of the pretrained tiny Qwen3 target (safetensors + tokenizer + generation config),
    for the trainer tests and the CLI tests that train on it (imported only when asked for).

    The first build pretrains for about 1.5 minutes; later runs find it in the cache."""
    from specdraft.trainer.assets import build_tiny_target

    return build_tiny_target()
