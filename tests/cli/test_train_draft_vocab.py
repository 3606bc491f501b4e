"""A run with model.draft_vocab_size: the vocabulary chosen from the data and recorded, the head
rows frozen through training, resume refusing another vocabulary, and the exports each engine
reads (vLLM's d2t, speculators' t2d/d2t) or a refusal naming why."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner
from safetensors.torch import load_file
from train_support import one_rank, single_thread, tiny_run, write_config

from specdraft.cli.main import cli
from specdraft.config import validate_config

SIZE = 512


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


@pytest.fixture(scope="module", params=["dflash", "dflash2", "dspark"])
def trained(request, tiny_target_path, tmp_path_factory):
    """A two-step checkpoint of each family with a 512-token draft vocabulary."""
    from specdraft.trainer.train.assembly import build_trainer

    root = tmp_path_factory.mktemp(f"vocab-{request.param}")
    data = tiny_run(
        tiny_target_path,
        root / "run",
        model={"algorithm": request.param, "draft_vocab_size": SIZE},
        data={"max_samples": 6},
    )
    with one_rank() as ctx:
        trainer = build_trainer(validate_config(data), ctx, progress=False)
        result = trainer.fit()
        trainer.writer.close()
    return request.param, root, data, result.last_checkpoint


def export(checkpoint, out, *args):
    return CliRunner().invoke(cli, ["export", str(checkpoint), "--out", str(out), *args])


def test_the_vocabulary_is_recorded_and_its_head_rows_stay_the_target_s(trained, tiny_target_path):
    from specdraft.trainer.models import load_target_head

    _, root, _, checkpoint = trained
    record = json.loads((root / "run" / "draft_vocab.json").read_text())
    config = json.loads((checkpoint / "config.json").read_text())
    assert record["draft_vocab_size"] == config["draft_vocab_size"] == SIZE
    assert record["ids"] == config["draft_vocab_ids"] == sorted(set(record["ids"]))
    assert 0.99 < record["train_coverage"] <= 1.0  # 6 short answers: few distinct labels
    weights = load_file(str(checkpoint / "model.safetensors"))
    head = load_target_head(tiny_target_path, torch.float32)
    expected = head.lm_head.weight[record["ids"]]
    assert torch.equal(weights["lm_head.weight"], expected)  # frozen: two steps left it as is


def test_the_vllm_export_carries_the_head_and_d2t_or_refuses(trained, tmp_path):
    family, _, _, checkpoint = trained
    done = export(checkpoint, tmp_path / "vllm", "--format", "vllm")
    ids = json.loads((checkpoint / "config.json").read_text())["draft_vocab_ids"]
    if family == "dflash2":
        assert done.exit_code == 2
        assert "draft vocabulary (512 of" in done.output and "d2t" in done.output
        return
    assert done.exit_code == 0, done.output
    config = json.loads((tmp_path / "vllm" / "config.json").read_text())
    assert config["draft_vocab_size"] == SIZE and "draft_vocab_ids" not in config
    tensors = load_file(str(tmp_path / "vllm" / "model.safetensors"))
    assert tensors["lm_head.weight"].shape[0] == SIZE and "t2d" not in tensors
    # vLLM maps draft id i to target id i + d2t[i].
    assert (torch.arange(SIZE) + tensors["d2t"]).tolist() == ids
    if family == "dspark":
        assert tensors["markov_head.markov_w2.weight"].shape[0] == SIZE


def test_the_speculators_export_carries_t2d_and_d2t_or_refuses(trained, tiny_target_path, tmp_path):
    family, _, _, checkpoint = trained
    done = export(
        checkpoint, tmp_path / "spec", "--format", "speculators", "--verifier", tiny_target_path
    )
    if family == "dflash2":
        assert done.exit_code == 2 and "requires the full verifier vocabulary" in done.output
        return
    assert done.exit_code == 0, done.output
    config = json.loads((tmp_path / "spec" / "config.json").read_text())
    assert config["draft_vocab_size"] == SIZE
    assert config["transformer_layer_config"]["vocab_size"] > SIZE
    tensors = load_file(str(tmp_path / "spec" / "model.safetensors"))
    ids = json.loads((checkpoint / "config.json").read_text())["draft_vocab_ids"]
    assert torch.nonzero(tensors["t2d"]).flatten().tolist() == ids
    assert (torch.arange(SIZE) + tensors["d2t"]).tolist() == ids


def test_sglang_export_refuses_a_draft_vocabulary(trained, tmp_path):
    _, _, _, checkpoint = trained
    done = export(checkpoint, tmp_path / "sglang")
    assert done.exit_code == 2
    assert "SGLang 0.5.23" in done.output and "--format vllm" in done.output


# One family is enough for the resume contract and the report (neither depends on it).
@pytest.mark.parametrize("trained", ["dflash"], indirect=True)
def test_resume_refuses_another_vocabulary_size(trained, tmp_path):
    from specdraft.trainer.train.assembly import build_trainer
    from specdraft.trainer.train.checkpoint import CheckpointMismatch

    _, root, data, _ = trained
    record = (root / "run" / "draft_vocab.json").read_bytes()
    changed = {**data, "model": {**data["model"], "draft_vocab_size": 256}}
    with one_rank() as ctx, pytest.raises(CheckpointMismatch, match="draft_vocab_size"):
        build_trainer(validate_config(changed), ctx, resume="latest", progress=False)
    # A refused resume leaves the run's record as it was.
    assert (root / "run" / "draft_vocab.json").read_bytes() == record


@pytest.mark.parametrize("trained", ["dflash"], indirect=True)
def test_explain_vocab_reports_the_configured_size(trained, tmp_path):
    _, root, data, _ = trained
    config = write_config(tmp_path / "run.toml", data)
    done = CliRunner().invoke(cli, ["explain-vocab", str(config), "--format", "json"])
    assert done.exit_code == 0, done.output
    report = json.loads(done.output[done.output.index("{") :])
    rows = {row["size"]: row for row in report["rows"]}
    record = json.loads((root / "run" / "draft_vocab.json").read_text())
    assert rows[SIZE]["why"] == "model.draft_vocab_size"
    assert rows[SIZE]["train"] == pytest.approx(record["train_coverage"])
    assert rows[report["target_vocab_size"]]["train"] == 1.0
    sizes = [s["size"] for s in report["suggestions"]]
    assert sizes == sorted(sizes) and all(s <= report["train_distinct"] for s in sizes)
    text = CliRunner().invoke(cli, ["explain-vocab", str(config)])
    assert text.exit_code == 0 and "covers 98% of" in text.output
    assert np.isclose(report["rows"][0]["train"], min(r["train"] for r in report["rows"]))
