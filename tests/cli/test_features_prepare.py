"""Offline feature shards: `prepare-features` resumes to the same shards as one run, training
refuses shards made for another config (naming the field), and training from shards starts with
the same loss as training with the target in-process."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from train_support import one_rank, single_thread, tiny_run, write_config

from specdraft.config import validate_config
from specdraft.trainer.features import prepare as prepare_module
from specdraft.trainer.features.meta import expected_feature_meta
from specdraft.trainer.features.prepare import prepare_features
from specdraft.trainer.features.shards import FeatureMismatch, FeatureShardDataset
from specdraft.trainer.integrity import CorruptFile


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


SAMPLES = 6


@pytest.fixture
def run_config(tiny_target_path, tmp_path):
    def make(**sections):
        base = tiny_run(tiny_target_path, tmp_path / "run", data={"max_samples": SAMPLES})
        from train_support import merge

        return validate_config(merge(base, sections))

    return make


def folder_bytes(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_an_interrupted_prepare_resumes_to_the_same_shards(run_config, tmp_path, monkeypatch):
    config = run_config()
    whole = prepare_features(config, tmp_path / "whole", shard_size=2, progress=False)
    assert (whole.num_samples, whole.shards_written, whole.shards_skipped) == (SAMPLES, 3, 0)

    written = []
    original = prepare_module.write_shard

    def die_after_one(folder, index, samples):
        if written:
            raise KeyboardInterrupt  # killed while computing the second shard
        written.append(index)
        return original(folder, index, samples)

    monkeypatch.setattr(prepare_module, "write_shard", die_after_one)
    with pytest.raises(KeyboardInterrupt):
        prepare_features(config, tmp_path / "resumed", shard_size=2, progress=False)
    monkeypatch.setattr(prepare_module, "write_shard", original)
    with pytest.raises(FeatureMismatch, match="incomplete"):
        FeatureShardDataset([tmp_path / "resumed"], expected=expected_feature_meta(config))

    again = prepare_features(config, tmp_path / "resumed", shard_size=2, progress=False)
    assert (again.shards_written, again.shards_skipped) == (2, 1)
    assert folder_bytes(tmp_path / "resumed") == folder_bytes(tmp_path / "whole")
    dataset = FeatureShardDataset([tmp_path / "resumed"], expected=expected_feature_meta(config))
    assert len(dataset) == SAMPLES
    sample = dataset[0]
    assert sample["hidden_states"].shape == (sample["input_ids"].shape[0], 2 * 128)

    with pytest.raises(FeatureMismatch, match="--shard-size 2"):
        prepare_features(config, tmp_path / "resumed", shard_size=3, progress=False)


def test_a_corrupted_shard_is_refused_naming_the_file(run_config, tmp_path):
    config = run_config()
    folder = tmp_path / "features"
    prepare_features(config, folder, shard_size=4, progress=False)
    index = json.loads((folder / "index.json").read_text())
    assert all(len(shard["sha256"]) == 64 for shard in index["shards"])
    shard = folder / index["shards"][1]["file"]
    with shard.open("r+b") as handle:
        handle.seek(shard.stat().st_size // 2)
        handle.write(bytes(4096))
    dataset = FeatureShardDataset([folder], expected=expected_feature_meta(config))
    assert dataset[0]["input_ids"].numel() > 0  # the intact first shard still reads
    with pytest.raises(CorruptFile) as caught:
        dataset[4]  # the first sample of the corrupted shard
    assert f"{shard}: content differs from the sha256 recorded in" in str(caught.value)
    assert "prepare-features" in str(caught.value)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"model": {"target_layer_ids": [0, 1]}}, "target_layer_ids (model.target_layer_ids)"),
        ({"data": {"max_length": 256}}, "max_length (data.max_length)"),
        ({"data": {"chat_template": "qwen"}}, "chat_template (data.chat_template)"),
        ({"model": {"algorithm": "dspark"}}, "with_last_hidden (model.algorithm"),
    ],
)
def test_training_refuses_shards_of_another_config_naming_the_field(
    run_config, tmp_path, change, named
):
    folder = tmp_path / "features"
    prepare_features(run_config(), folder, shard_size=4, progress=False)
    other = run_config(**change)
    with pytest.raises(FeatureMismatch) as caught:
        FeatureShardDataset([folder], expected=expected_feature_meta(other))
    assert named in str(caught.value)
    assert "prepare-features" in str(caught.value)
    # Finishing the folder with the other config is refused the same way.
    with pytest.raises(FeatureMismatch, match=named.split(" ")[0]):
        prepare_features(other, folder, shard_size=4, progress=False)


def test_cli_writes_to_the_run_folder_by_default(run_config, tmp_path):
    from specdraft.cli.main import cli

    config_file = write_config(
        tmp_path / "run.toml", tiny_run(run_config().model.target, tmp_path / "out")
    )
    done = CliRunner().invoke(cli, ["prepare-features", str(config_file), "--no-progress"])
    assert done.exit_code == 0, done.output
    index = json.loads((tmp_path / "out" / "features" / "index.json").read_text())
    assert index["complete"] and index["meta"]["target_layer_ids"] == [0, 2]
    assert "data.format" in done.output

    features = ["--set", 'data.format="features"']
    done = CliRunner().invoke(cli, ["prepare-features", str(config_file), *features])
    assert done.exit_code == 1
    assert "reads the conversations of a 'sharegpt' config" in done.output


@pytest.mark.parametrize("algorithm", ["dflash2", "dspark"])
def test_training_from_shards_starts_with_the_in_process_loss(run_config, tmp_path, algorithm):
    from specdraft.trainer.train.assembly import build_trainer

    sections = {
        "model": {"algorithm": algorithm},
        "training": {"max_steps": 2, "micro_batch_size": 2, "grad_accum_steps": 2},
    }
    # Evaluation once (it is the same code for both algorithms).
    evaluation = {"eval_paths": ["pkg:sharegpt"], "max_eval_samples": 2}
    evaluation = evaluation if algorithm == "dflash2" else {}
    in_process = run_config(output_dir=str(tmp_path / "a"), data=evaluation, **sections)
    prepare_features(in_process, tmp_path / "features", shard_size=4, progress=False)
    offline = run_config(
        output_dir=str(tmp_path / "b"),
        data={"format": "features", "train_paths": [str(tmp_path / "features")], **evaluation},
        **sections,
    )
    losses, taus = [], []
    with one_rank() as ctx:
        for config in (in_process, offline):
            trainer = build_trainer(config, ctx, progress=False)
            result = trainer.fit()
            trainer.writer.close()
            losses.append([r.loss for r in result.history])
            taus.append([e["tau"] for e in result.evals])
    # The same samples, order, anchors and initial weights; the target features differ only by
    # float rounding (one target forward per training micro-batch vs per prepare batch).
    assert len(losses[0]) == len(losses[1]) == 2
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    if evaluation:
        # Offline features train; evaluation still reads the held-out conversations.
        assert len(taus[1]) == 2 and taus[1][0] == taus[0][0]
