"""`specdraft train`: the --dry-run plan, refusals before any rank starts, and a failing rank."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from specdraft.cli.main import cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "qwen3-8b-dflash2-2048.toml"

# Qwen3-8B's published architecture (config.json only: the dry run never reads weights).
QWEN3_8B = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "eos_token_id": 151645,
    "bos_token_id": 151643,
}


@pytest.fixture
def tiny_config(tmp_path: Path) -> Path:
    """A tiny DFlash2 run on the tiny target (2 draft layers, buckets 128/256, 2 steps)."""
    from specdraft.trainer.assets import build_tiny_target, tiny_assets_info

    path = tmp_path / "tiny.toml"
    path.write_text(
        f"""
run_id = "cli-train"
output_dir = "{tmp_path / "run"}"
[model]
target = "{build_tiny_target()}"
algorithm = "dflash2"
block_size = 8
num_draft_layers = 2
target_layer_ids = [0, 2]
mask_token_id = {tiny_assets_info().mask_token_id}
dtype = "float32"
[model.dflash2]
selector_gold_policy = "insert"
selector_rank = 32
selector_top_k = 8
[data]
train_paths = ["pkg:sharegpt"]
max_length = 256
max_samples = 16
[training]
micro_batch_size = 2
grad_accum_steps = 2
num_anchors = 16
max_steps = 2
static_shapes = true
static_shape_buckets = [128]
compile_blocks = true
[tracking]
progress_bar = false
"""
    )
    return path


@pytest.fixture
def no_launch(monkeypatch):
    """Fail the test if `train` starts ranks."""
    import specdraft.trainer.launch as launch_module

    def refuse(*args, **kwargs):
        raise AssertionError("train started ranks")

    monkeypatch.setattr(launch_module, "launch", refuse)


def train(*args: str):
    return CliRunner().invoke(cli, ["train", *args], catch_exceptions=False)


def plan_lines(output: str) -> dict[str, str]:
    """The dry-run plan as {label: text}."""
    return dict(
        (label.strip(), text.strip())
        for label, _, text in (line.partition(":") for line in output.splitlines())
    )


def test_dry_run_prints_the_plan_without_starting_ranks(tiny_config, no_launch):
    result = train(str(tiny_config), "--dry-run", "--nproc-per-node", "2")
    assert result.exit_code == 0, result.output
    plan = plan_lines(result.output)
    assert plan["ranks"].startswith("2 (1 node(s) x 2) on cpu (gloo)")
    assert plan["backend"].startswith("fsdp2")
    assert plan["pad policy"] == "buckets 128, 256"
    # 2 shapes x 2 graphs (first block without grad, second with), no evaluation; slack of 4.
    assert "2 length(s) x 2 = 4 graphs per block" in plan["compile"]
    assert "recompile_limit = 8" in plan["compile"]
    assert plan["shape grid"].startswith("2 cell(s)")
    assert "weights+grads+AdamW" in plan["memory/rank"]
    assert not (tiny_config.parent / "run").exists()


def test_dry_run_follows_overrides(tiny_config, no_launch):
    result = train(
        str(tiny_config),
        "--dry-run",
        "--set",
        "training.backend=fsdp1",
        "--set",
        "training.compile_blocks=false",
    )
    assert result.exit_code == 0, result.output
    plan = plan_lines(result.output)
    assert plan["backend"].startswith("fsdp1")
    assert plan["compile"] == "compile_blocks off: blocks run eagerly"


def test_dry_run_prints_the_length_x_anchor_grid(tiny_config, no_launch):
    from specdraft.config import load_config

    num_anchors = load_config(tiny_config).training.num_anchors
    small = max(1, num_anchors // 2)
    result = train(
        str(tiny_config), "--dry-run", "--set", f"training.static_anchor_buckets=[{small}]"
    )
    assert result.exit_code == 0, result.output
    plan = plan_lines(result.output)
    assert plan["anchors"] == f"anchor buckets {small}, {num_anchors}"
    cells = f"128x{small}, 128x{num_anchors}, 256x{small}, 256x{num_anchors}"
    assert plan["shape grid"] == f"4 cell(s) (length x anchors): {cells}"
    # 2 lengths x 2 widths x 2 grad variants, no evaluation.
    assert "2 length(s) x (2 width(s) x 2) = 8 graphs per block" in plan["compile"]


def gib(text: str, label: str) -> float:
    """The GiB figure printed before `label` in a memory line."""
    found = re.search(r"~([\d.]+) GiB " + re.escape(label), text)
    assert found, (label, text)
    return float(found.group(1))


def test_dry_run_memory_estimate_of_the_qwen3_8b_example_is_sane(tmp_path, no_launch):
    from specdraft.config import load_config
    from specdraft.trainer.models import build_draft, load_target_config

    target = tmp_path / "qwen3-8b"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(QWEN3_8B))
    overrides = ["--set", f"model.target={target}"]
    result = train(str(EXAMPLE), "--dry-run", *overrides)
    assert result.exit_code == 0, result.output
    plan = plan_lines(result.output)
    assert plan["ranks"].startswith("8 (1 node(s) x 8)")

    config = load_config(EXAMPLE, [f"model.target={target}"])
    draft = build_draft(config.model, load_target_config(str(target)), device="meta")
    params = sum(p.numel() for p in draft.parameters())
    # The draft alone: the frozen embedding and LM head (1.2B parameters) are not trained.
    assert plan["draft"] == f"{params / 1e6:.1f}M trainable parameters"
    assert 0.5e9 < params < 2e9
    memory = plan["memory/rank"]
    # fp32 weights + grads + two AdamW moments = 16 bytes per parameter, over 8 ranks.
    assert gib(memory, "weights+grads+AdamW") == pytest.approx(params * 16 / 8 / 2**30, abs=0.01)
    # Embedding and LM head, each vocab x hidden, fp32 on this CPU-only machine.
    assert gib(memory, "frozen embedding+LM head") == pytest.approx(
        2 * 151936 * 4096 * 4 / 2**30, abs=0.01
    )
    # Qwen3-8B has 8.2B parameters; every rank holds a copy to compute features in-process.
    found = re.search(r"([\d.]+)M parameters, ~([\d.]+) GiB per rank", plan["target"])
    assert found, plan["target"]
    assert 8.0e9 < float(found.group(1)) * 1e6 < 8.4e9
    assert float(found.group(2)) == pytest.approx(float(found.group(1)) * 1e6 * 4 / 2**30, 0.01)


def test_dry_run_plans_a_draft_vocabulary_as_frozen_head_and_narrower_logits(tmp_path, no_launch):
    target = tmp_path / "qwen3-8b"
    target.mkdir()
    (target / "config.json").write_text(json.dumps(QWEN3_8B))
    full = train(str(EXAMPLE), "--dry-run", "--set", f"model.target={target}")
    assert full.exit_code == 0, full.output
    pruned = train(
        str(EXAMPLE),
        "--dry-run",
        "--set",
        f"model.target={target}",
        "--set",
        "model.draft_vocab_size=32768",
    )
    assert pruned.exit_code == 0, pruned.output
    before, after = plan_lines(full.output), plan_lines(pruned.output)
    assert before["vocabulary"] == "the target's 151,936 tokens (model.draft_vocab_size unset)"
    assert after["vocabulary"].startswith("32,768 of the target's 151,936 tokens (22%)")
    assert "specdraft explain-vocab" in after["vocabulary"]
    # The draft's own head is frozen rows of the target's: not trained, counted as frozen.
    assert after["draft"] == before["draft"]
    frozen = gib(after["memory/rank"], "frozen embedding+LM head")
    assert frozen == pytest.approx((2 * 151936 + 32768) * 4096 * 4 / 2**30, abs=0.01)

    # The logits chunk is as wide as the draft vocabulary.
    def logits(plan: dict[str, str]) -> float:
        found = re.search(r"~([\d.]+) (GiB|MiB) logits", plan["memory/rank"])
        assert found, plan["memory/rank"]
        return float(found.group(1)) * (1024 if found.group(2) == "GiB" else 1)

    assert logits(after) / logits(before) == pytest.approx(32768 / 151936, rel=0.02)


@pytest.mark.parametrize("dry_run", [False, True])
def test_fp8_linear_on_cpu_is_refused_before_any_rank_starts(tiny_config, no_launch, dry_run):
    args = [str(tiny_config), "--set", "training.fp8_linear=true"]
    result = train(*args, *(["--dry-run"] if dry_run else []))
    assert result.exit_code == 1
    assert str(tiny_config) in result.output
    assert "training.fp8_linear" in result.output
    assert "CUDA" in result.output
    assert "fp8_linear = false" in result.output


# Installed through PYTHONPATH into every process of the run (the CLI and each spawned rank):
# rank 1 raises while rank 0 goes on into the rendezvous and data loading, where it would wait
# for rank 1 forever if the launcher did not stop it.
FAIL_RANK_1 = """
import importlib.abc, importlib.util, sys

class FailRankOne(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "specdraft.trainer.train.assembly":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            build = module.build_trainer

            def build_trainer(config, ctx, **kwargs):
                if ctx.rank == 1:
                    raise RuntimeError("injected failure on rank 1")
                return build(config, ctx, **kwargs)

            module.build_trainer = build_trainer

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, FailRankOne())
"""


@pytest.mark.slow
@pytest.mark.distributed
def test_a_failing_rank_ends_the_run_with_its_traceback(tmp_path, tiny_config):
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(FAIL_RANK_1)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(hook), env.get("PYTHONPATH")]))
    argv = [sys.executable, "-m", "specdraft.cli", "train", str(tiny_config), "--no-progress"]
    done = subprocess.run(
        [*argv, "--nproc-per-node", "2", "--set", "training.compile_blocks=false"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,  # a hang fails here rather than at the suite's timeout
    )
    assert done.returncode != 0
    assert "trainer rank 1 failed" in done.stderr
    assert "RuntimeError: injected failure on rank 1" in done.stderr
    assert "Traceback" in done.stderr
    assert not (tiny_config.parent / "run" / "summary.json").exists()


def test_two_sets_of_one_key_report_the_one_in_effect(tiny_config, no_launch):
    first, last = "training.static_shape_buckets=[128]", "training.static_shape_buckets=[1000]"
    result = train(str(tiny_config), "--dry-run", "--set", first, "--set", last)
    assert result.exit_code == 2
    assert f"(from --set {last})" in result.output
    assert f"(from --set {first})" not in result.output


def test_dry_run_names_what_a_sliding_window_saves(tiny_config, no_launch):
    plain = plan_lines(train(str(tiny_config), "--dry-run").output)
    assert "attention" not in plain
    result = train(str(tiny_config), "--dry-run", "--set", "model.sliding_window=64")
    assert result.exit_code == 0, result.output
    line = plan_lines(result.output)["attention"]
    # buckets 128, 256 (see above): a 64-key window skips more of the longer bucket's keys.
    assert line.startswith("windows 64")
    shares = [int(part.split("%")[0].split()[-1]) for part in line.split(" at ")[:-1]]
    assert len(shares) == 2 and 0 < shares[0] < shares[1] < 100
    assert "saves no CPU time or memory" in line
