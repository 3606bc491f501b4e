"""Drafts and the target as GGUF files for llama.cpp build 11434 (scripts/llama_cpp_build.sh).

- `export --format gguf` of a full-vocabulary draft of each family is, key for key and tensor
  for tensor (names, shapes, types, bytes), what llama.cpp's converter writes from the
  `--format sglang` export, run here by hand (the tiny tokenizer named `qwen2`).
- With a draft vocabulary (every family): every key and tensor of the full-vocabulary file, plus
  `d2t` (the run's draft vocabulary as absolute target ids) and `output.weight` (the target
  head's rows of those ids).
- `assets target-gguf`: llama-server's greedy continuation of the tiny target is HF's, token
  for token; a DFlash2 draft with a draft vocabulary comes up with `-md` and leaves the greedy
  output as it was (the other families are served in tests/serve/test_serve_llama_cpp.py).
- What llama.cpp cannot load is refused (exit 2) with the option that fixes it.

The one-step checkpoints are trained here: DFlash2 with tiny_run's selector (top_k 4 fits the
hidden row llama.cpp fills), DSpark with the confidence head on the Markov features.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from serve_support import ROOT, gguf_contents, llama_cpp_build, specdraft_cli

pytestmark = [
    pytest.mark.serve,
    pytest.mark.slow,
    pytest.mark.subprocess,
    pytest.mark.timeout(1800),
]

# The drafts of the tests: family name -> [model] options (on top of tiny_run's).
RUNS = {
    "dflash": {"algorithm": "dflash"},
    "dflash2": {"algorithm": "dflash2"},
    "dspark": {"algorithm": "dspark", "dspark": {"confidence_uses_markov": True}},
}
DRAFT_VOCAB = 512
# llama-server's --spec-type and --spec-draft-n-max (block_size - 1; DSpark: block_size).
SPEC = {
    "dflash": ("draft-dflash", 7),
    "dflash2": ("draft-dflash", 7),
    "dspark": ("draft-dspark", 8),
}
NEW_TOKENS = 16

# The reference: llama.cpp's converter run by hand, its pre-tokenizer lookup answering `qwen2`
# (the tiny tokenizer's split is Qwen2's; the converter does not know its hash).
BY_HAND = """
import sys
home = sys.argv[1]
sys.path[:0] = [home, home + "/gguf-py"]
import convert_hf_to_gguf
from conversion.base import TextModel
TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[2:]]
convert_hf_to_gguf.main()
"""


@pytest.fixture(scope="module")
def llama():
    """The llama.cpp build (built, or waited for, once)."""
    return llama_cpp_build()


def one_step(target: Path, root: Path, **model) -> Path:
    """A one-step checkpoint on the tiny target with these [model] options."""
    from train_support import one_rank, single_thread, tiny_run

    from specdraft.config import validate_config
    from specdraft.trainer.train.assembly import build_trainer

    config = validate_config(
        tiny_run(target, root, model=model, data={"max_samples": 4}, training={"max_steps": 1})
    )
    with single_thread(), one_rank() as ctx:
        trainer = build_trainer(config, ctx, progress=False)
        checkpoint = trainer.fit().last_checkpoint
        trainer.writer.close()
    return Path(checkpoint)


@pytest.fixture(scope="module")
def checkpoints(tiny_target_path, tmp_path_factory):
    """(family, with a draft vocabulary) -> its one-step checkpoint."""
    root = tmp_path_factory.mktemp("gguf-checkpoints")
    out = {}
    for family, model in RUNS.items():
        out[family, False] = one_step(tiny_target_path, root / family, **model)
        vocab = {**model, "draft_vocab_size": DRAFT_VOCAB}
        out[family, True] = one_step(tiny_target_path, root / f"{family}-vocab", **vocab)
    return out


@pytest.fixture(scope="module")
def exported(checkpoints, tiny_target_path, tmp_path_factory, llama):
    """(family, with a draft vocabulary) -> its `export --format gguf` file (made once)."""
    from specdraft.trainer.export import export_checkpoint

    root, made = tmp_path_factory.mktemp("gguf-exports"), {}

    def export(family: str, vocab: bool) -> Path:
        if (family, vocab) not in made:
            out = root / f"{family}{'-vocab' if vocab else ''}.gguf"
            result = export_checkpoint(
                checkpoints[family, vocab],
                out,
                format="gguf",
                verifier=str(tiny_target_path),
                dtype="float32",
            )
            assert result.path == out and out.is_file()
            made[family, vocab] = out
        return made[family, vocab]

    return export


@pytest.fixture(scope="module")
def target_gguf(tiny_target_path, tmp_path_factory, llama):
    """The tiny target's GGUF, written by `specdraft assets target-gguf`."""
    out = tmp_path_factory.mktemp("target-gguf") / "target.gguf"
    done = specdraft_cli(
        *("assets", "target-gguf", "--target", str(tiny_target_path), "--out", str(out)), cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert out.is_file()
    again = specdraft_cli(
        *("assets", "target-gguf", "--target", str(tiny_target_path), "--out", str(out)), cwd=ROOT
    )
    assert again.returncode == 2 and "--force" in again.stderr  # never over a file unasked
    return out


@pytest.fixture(scope="module")
def greedy(tiny_target_path):
    """A chat prompt of the tiny tokenizer and the HF tiny target's greedy continuation."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_target_path))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_target_path), dtype=torch.float32)
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)
    return prompt, out[0, len(prompt) :].tolist()


def served(llama, target: Path, prompt: list[int], log: Path, extra: tuple[str, ...] = ()):
    """llama-server (`-t 1`, loopback, its own port) on `target`: one greedy /completion."""
    from specdraft.trainer.serve.llama_server import LlamaServer, ServerOptions

    options = ServerOptions(target, threads=1, ctx_size=512, extra=extra)
    with LlamaServer(llama.server, options, log, timeout=300.0) as server:
        return server.complete(
            {
                "prompt": prompt,
                "n_predict": NEW_TOKENS,
                "temperature": 0,
                "top_k": 1,
                "return_tokens": True,
                "cache_prompt": False,
            }
        )


@pytest.mark.parametrize("family", sorted(RUNS))
def test_a_full_vocabulary_export_is_what_the_converter_writes_from_the_sglang_export(
    family, llama, checkpoints, exported, tiny_target_path, tmp_path
):
    from specdraft.trainer.export import export_checkpoint
    from specdraft.trainer.export.gguf import draft_model_name

    checkpoint = checkpoints[family, False]
    sglang = export_checkpoint(checkpoint, tmp_path / "sglang", format="sglang", dtype="float32")
    architecture = json.loads((sglang.path / "config.json").read_text())["architectures"][0]
    by_hand = tmp_path / "by-hand.gguf"
    done = subprocess.run(
        [
            *(sys.executable, "-c", BY_HAND, str(llama.home), str(sglang.path)),
            *("--target-model-dir", str(tiny_target_path), "--outfile", str(by_hand)),
            *("--outtype", "f32", "--model-name", draft_model_name(architecture, tiny_target_path)),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ours, theirs = gguf_contents(llama, exported(family, False)), gguf_contents(llama, by_hand)
    assert ours["keys"] == theirs["keys"]
    assert ours["tensors"] == theirs["tensors"]
    assert ours["keys"]["general.architecture"][1] == "dflash"
    assert ours["keys"]["tokenizer.ggml.pre"][1] == "qwen2"
    assert "d2t" not in ours["tensors"] and "output.weight" not in ours["tensors"]


@pytest.mark.parametrize("family", sorted(RUNS))
def test_a_draft_vocabulary_adds_d2t_and_the_target_head_s_rows(
    family, llama, checkpoints, exported, tiny_target_path
):
    import torch
    from safetensors.torch import load_file

    full = gguf_contents(llama, exported(family, False))
    vocab = gguf_contents(llama, exported(family, True), arrays=("d2t", "output.weight"))
    for key, (types, _) in full["keys"].items():
        assert vocab["keys"][key][0] == types, key
    for name, (kind, shape, _) in full["tensors"].items():
        # DSpark's Markov bias has a row per draft token (ggml shapes list the rows last).
        rows = [shape[0], DRAFT_VOCAB] if name == "markov_w2.weight" else shape
        assert vocab["tensors"][name][:2] == [kind, rows], name
    config = json.loads((checkpoints[family, True] / "config.json").read_text())
    ids = config["draft_vocab_ids"]
    assert len(ids) == DRAFT_VOCAB and ids != list(range(DRAFT_VOCAB))
    assert vocab["tensors"]["d2t"][:2] == ["I64", [DRAFT_VOCAB]]
    assert vocab["arrays"]["d2t"] == ids
    head = load_file(str(tiny_target_path / "model.safetensors"))["lm_head.weight"]
    hidden = head.shape[1]
    assert vocab["tensors"]["output.weight"][:2] == ["F32", [hidden, DRAFT_VOCAB]]
    rows = torch.tensor(vocab["arrays"]["output.weight"], dtype=torch.float32)
    assert torch.equal(rows, head[ids].to(torch.float32))
    added = set(vocab["tensors"]) - set(full["tensors"])
    assert added == {"d2t", "output.weight"}


def test_the_target_s_gguf_continues_greedily_as_the_hf_target(
    llama, target_gguf, greedy, tmp_path
):
    prompt, expected = greedy
    answer = served(llama, target_gguf, prompt, tmp_path / "server.log")
    assert answer["tokens"] == expected  # all 16 tokens (f32 GGUF against the fp32 HF model)


# tests/serve/test_serve_llama_cpp.py serves every family's full-vocabulary draft and DFlash's
# and DSpark's with a draft vocabulary through `eval --engine llama.cpp`; what only this file
# exercises is a DFlash2 draft vocabulary (d2t where llama.cpp's converter writes none), so that
# is the one server start here (each costs a server and a target load on CI's two cores).
@pytest.mark.parametrize(("family", "vocab"), [("dflash2", True)], ids=["dflash2-draft-vocab"])
def test_a_draft_loads_with_md_and_keeps_the_greedy_output(
    family, vocab, llama, exported, target_gguf, greedy, tmp_path
):
    prompt, expected = greedy
    spec_type, n_max = SPEC[family]
    extra = ("-md", str(exported(family, vocab)), "--spec-type", spec_type)
    extra += ("--spec-draft-n-max", str(n_max), "-td", "1")
    answer = served(llama, target_gguf, prompt, tmp_path / "server.log", extra)
    assert answer["tokens"] == expected
    assert answer["timings"]["draft_n"] > 0  # the draft proposed tokens


def test_what_llama_cpp_cannot_load_is_refused_with_the_option_that_fixes_it(
    family_checkpoints, tiny_target_path, tmp_path
):
    out = tmp_path / "draft.gguf"
    # The family default: a DSpark confidence head of the draft state alone.
    done = specdraft_cli(
        *("export", str(family_checkpoints["dspark"]), "--format", "gguf"),
        *("--verifier", str(tiny_target_path), "--out", str(out)),
        cwd=ROOT,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "model.dspark.confidence_uses_markov = true" in done.stderr
    assert not out.exists()
    done = specdraft_cli(
        *("export", str(family_checkpoints["dflash"]), "--format", "gguf", "--out", str(out)),
        cwd=ROOT,
    )
    assert done.returncode == 2 and "--verifier TARGET_DIR" in done.stderr
    inside = tiny_target_path / "draft.gguf"
    done = specdraft_cli(
        *("export", str(family_checkpoints["dflash"]), "--format", "gguf"),
        *("--verifier", str(tiny_target_path), "--out", str(inside), "--force"),
        cwd=ROOT,
    )
    assert done.returncode == 2 and "inside the target's folder" in done.stderr
    assert not inside.exists()
