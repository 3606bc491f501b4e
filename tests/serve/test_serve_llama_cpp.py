"""Drafts served by the real llama.cpp (build 11434, scripts/llama_cpp_build.sh) on the tiny
target, through `specdraft eval --engine llama.cpp`.

- Each family's small quickstart draft (trained once, cached: tests/support/serve_support.py):
  greedy outputs identical with and without the draft, and equal to the HF target's; llama.cpp's
  acceptance length within 3% of specdraft's own estimate on the same prompts, position by
  position too; the same with a draft vocabulary (DFlash, DSpark).
- `--speed`: the tokens/s table's rows and shape, the real settings' outputs identical.
- Errors: llama-server's own reason for a draft it refuses; no build -> the command that builds
  it (exit 2).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from serve_support import (
    QUICKSTART_DFLASH,
    ROOT,
    llama_cpp_build,
    quickstart_family_run,
    specdraft_cli,
)

pytestmark = [
    pytest.mark.serve,
    pytest.mark.slow,
    pytest.mark.subprocess,
    pytest.mark.timeout(1800),
]


@pytest.fixture(scope="module")
def llama_cpp():
    """The llama.cpp build (built, or waited for, once)."""
    return llama_cpp_build()


def eval_llama(target: Path, family: str, extra: tuple[str, ...] = (), *options: str):
    """`specdraft eval --engine llama.cpp` of the family's quickstart draft; the process."""
    checkpoint, overrides = quickstart_family_run(target, family, extra)
    return specdraft_cli(
        *("eval", str(QUICKSTART_DFLASH), "--checkpoint", str(checkpoint), *overrides),
        *("--engine", "llama.cpp", *options),
        cwd=ROOT,
    )


def served(target: Path, family: str, extra: tuple[str, ...] = ()) -> dict:
    """The JSON result of serving the family's quickstart draft, checked as every test wants."""
    done = eval_llama(target, family, extra, "--format", "json")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(done.stdout[done.stdout.index("{") :])
    ours, theirs = result["specdraft"], result["llama_cpp"]
    print(
        f"{family} {extra}: acceptance length specdraft {ours['acceptance_length']:.4f}, "
        f"llama.cpp {theirs['acceptance_length']:.4f} (per drafted step "
        f"{theirs['per_step']['acceptance_length']:.4f})",
        ours["per_position_given_previous"],
        theirs["per_step"]["per_position_given_previous"],
    )
    assert result["stage"] == "done" and result["family"] == family
    assert result["build"] == 11434
    # Greedy verification cannot change the target's output, and the f32 GGUF of the target
    # generates what the HF target does.
    assert result["outputs_identical"], result
    assert result["matches_target_greedy"] == result["prompts"], result
    assert theirs["steps"] > 100  # enough verification steps to compare
    # A trained draft: well above the 1.0 of a draft that never matches, so that agreement
    # is not the trivial one of a draft that accepts nothing.
    assert ours["acceptance_length"] > 1.2
    assert (
        abs(theirs["acceptance_length"] - ours["acceptance_length"])
        <= 0.03 * (ours["acceptance_length"])
    ), (theirs, ours)
    given = theirs["per_step"]["per_position_given_previous"]
    assert len(given) == result["draft_tokens"]
    assert given[0] == pytest.approx(ours["per_position_given_previous"][0], abs=0.03)
    return result


@pytest.mark.parametrize("family", ["dflash", "dflash2", "dspark"])
def test_each_family_serves_in_llama_cpp_at_specdraft_s_estimated_acceptance(
    llama_cpp, tiny_target_path, family
):
    result = served(tiny_target_path, family)
    # llama.cpp drafts what the family's block proposes: bs - 1, DSpark bs (block_size 8).
    assert result["draft_tokens"] == (8 if family == "dspark" else 7)


@pytest.mark.parametrize("family", ["dflash", "dspark"])
def test_a_draft_vocabulary_serves_with_identical_outputs_at_the_estimated_acceptance(
    llama_cpp, tiny_target_path, family
):
    # 1024 of the tiny target's 4096 tokens: the draft's own head, mapped through d2t.
    served(tiny_target_path, family, ("model.draft_vocab_size=1024",))


def test_speed_prints_every_setting_side_by_side_with_identical_outputs(
    llama_cpp, tiny_target_path
):
    done = eval_llama(tiny_target_path, "dflash", (), "--speed", "--parallel", "2")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("output tokens/s"))
    assert "llama.cpp build 11434" in lines[start] and "(-np 2)" in lines[start]
    table = lines[start + 2 : start + 11]
    labels = [
        "target alone",
        "dflash draft",
        "ngram-simple",
        "ngram-map-k",
        "ngram-mod",
        "ngram-cache (8 fixed)",
        "  at accept",
        "  at accept 8 (synth)",
    ]
    for line, label in zip(table, labels, strict=False):
        assert line.startswith(label), (line, label)
    prompts = int(lines[start].split("batch 1 = ")[1].split()[0])
    for line in table[:6]:
        # setting, accept len, tok/s and x at batch 1, at 2 slots, identical counts
        assert f"{prompts}/{prompts}, {prompts}/{prompts}" in line, line
        assert line.split()[-5].endswith("x") and line.split()[-3].endswith("x"), line
    assert all(line.endswith("(synthetic acceptance)") for line in table[6:8])
    assert lines[start + 10].startswith("batch 1: the draft gives")
    assert lines[start + 11].startswith("batch 1 at the draft's acceptance drawn at random")


def test_a_draft_llama_server_refuses_is_reported_in_its_own_words(
    llama_cpp, tiny_target_path, tmp_path
):
    from specdraft.config import load_config
    from specdraft.trainer.serve.llama_served import (
        default_draft_tokens,
        default_target_gguf,
        run_phase,
    )
    from specdraft.trainer.serve.llama_server import LlamaServerFailed
    from specdraft.trainer.serve.llama_settings import draft_setting

    _, overrides = quickstart_family_run(tiny_target_path, "dflash")
    pairs = [value for flag, value in zip(overrides[::2], overrides[1::2], strict=True)]
    target = default_target_gguf(load_config(str(QUICKSTART_DFLASH), pairs), llama_cpp)
    # A cut GGUF: its header reads, its tensors do not.
    draft = tmp_path / "cut.gguf"
    draft.write_bytes(target.read_bytes()[:4096])
    setting = draft_setting("dflash", draft, default_draft_tokens("dflash", 8))
    with pytest.raises(LlamaServerFailed) as failed:
        run_phase(
            llama_cpp,
            setting,
            [[1, 2, 3]],
            4,
            target=target,
            threads=1,
            parallel=1,
            per_slot_ctx=256,
            log=tmp_path / "refused.log",
        )
    print(failed.value.reason)
    assert "draft" in failed.value.reason.lower() or "cut.gguf" in failed.value.reason
    assert failed.value.log == tmp_path / "refused.log"
    assert "exited with code" in str(failed.value)


def test_without_a_build_eval_names_the_command_that_builds_it(
    tiny_target_path, tmp_path, monkeypatch
):
    monkeypatch.setenv("SPECDRAFT_LLAMA_CPP", str(tmp_path / "no-build"))
    done = eval_llama(tiny_target_path, "dflash")
    assert done.returncode == 2, done.stdout + done.stderr[-2000:]
    assert "bash scripts/llama_cpp_build.sh" in done.stderr
    assert "Traceback" not in done.stderr
