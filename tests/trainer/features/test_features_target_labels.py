"""The target's predictions in offline features: `prepare-features` stores its argmax and top-K
per position when the config trains on them, training reads them back as the labels the
in-process target gives (same loss), packed rows take each document's own labels, and a
folder without them is refused, naming what it lacks and the command that makes it."""

from __future__ import annotations

import json

import pytest
import torch
from train_support import merge, one_rank, single_thread, tiny_run

from specdraft.config import ShapePolicy, validate_config
from specdraft.trainer.features.meta import FeatureMismatch, expected_feature_meta
from specdraft.trainer.features.prepare import prepare_features
from specdraft.trainer.features.shards import FeatureShardDataset
from specdraft.trainer.models import TargetFeatureExtractor, load_target_head
from specdraft.trainer.models.target_labels import (
    SOFT_IDS,
    SOFT_LOGPROBS,
    TARGET_ARGMAX,
    TARGET_LABELS,
    TARGET_TOPK_IDS,
    TARGET_TOPK_LOGPROBS,
    LabelSettings,
    TargetLabeler,
    target_predictions,
)

SAMPLES = 6
LABELS = {"data": {"labels": "target_argmax"}}
SOFT = {"training": {"soft_label_topk": 4, "soft_label_weight": 0.5}}


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


@pytest.fixture
def run_config(tiny_target_path, tmp_path):
    def make(*sections):
        config = tiny_run(tiny_target_path, tmp_path / "run", data={"max_samples": SAMPLES})
        for section in sections:
            config = merge(config, section)
        return validate_config(config)

    return make


def test_prepare_stores_the_targets_argmax_and_top_k_per_position(run_config, tmp_path):
    config = run_config(LABELS, SOFT)
    prepare_features(config, tmp_path / "features", shard_size=4, progress=False)
    dataset = FeatureShardDataset(
        [tmp_path / "features"],
        expected=expected_feature_meta(config),
        labels=LabelSettings.from_config(config),
    )
    assert (dataset.meta["target_argmax"], dataset.meta["target_topk"]) == (True, 4)
    target = config.model.target
    extractor = TargetFeatureExtractor(target, [0, 2], dtype=torch.float32)
    head = load_target_head(target, torch.float32)
    for index in (0, SAMPLES - 1):
        sample = dataset[index]
        ids = sample["input_ids"]
        assert sample[TARGET_ARGMAX].dtype == sample[TARGET_TOPK_IDS].dtype == torch.int32
        assert sample[TARGET_TOPK_LOGPROBS].dtype == torch.float32
        assert sample[TARGET_TOPK_IDS].shape == (len(ids), 4)
        # The target alone on this sample (no batch padding) predicts the same.
        _, last = extractor(ids[None], torch.ones(1, len(ids), dtype=torch.long))
        alone = target_predictions(last[0], head.lm_head.weight, 4)
        assert torch.equal(sample[TARGET_ARGMAX], alone[TARGET_ARGMAX])
        assert torch.equal(sample[TARGET_TOPK_IDS], alone[TARGET_TOPK_IDS])
        torch.testing.assert_close(sample[TARGET_TOPK_LOGPROBS], alone[TARGET_TOPK_LOGPROBS])
    # A config that trains on the tokens stores none of it.
    prepare_features(run_config(), tmp_path / "plain", shard_size=4, progress=False)
    plain = FeatureShardDataset([tmp_path / "plain"], expected=None)
    assert (plain.meta["target_argmax"], plain.meta["target_topk"]) == (False, 0)
    assert not {TARGET_ARGMAX, TARGET_TOPK_IDS, TARGET_TOPK_LOGPROBS} & set(plain[0])


def test_a_folder_without_the_predictions_is_refused_naming_them(run_config, tmp_path):
    prepare_features(run_config(), tmp_path / "plain", shard_size=4, progress=False)
    argmax = run_config(LABELS)
    with pytest.raises(FeatureMismatch) as refused:
        FeatureShardDataset(
            [tmp_path / "plain"],
            expected=expected_feature_meta(argmax),
            labels=LabelSettings.from_config(argmax),
        )
    message = str(refused.value)
    assert "target_argmax (data.labels = 'target_argmax'): the folder holds no argmax" in message
    assert "specdraft prepare-features CONFIG --out NEW_DIR" in message
    # Top 4 stored: a run that asks for 8 is refused, one that asks for 2 reads the first 2.
    prepare_features(run_config(SOFT), tmp_path / "top4", shard_size=4, progress=False)
    wider = LabelSettings(soft_topk=8)
    with pytest.raises(FeatureMismatch, match=r"soft_label_topk = 8 .*holds the top 4"):
        FeatureShardDataset([tmp_path / "top4"], expected=None, labels=wider)
    narrower = FeatureShardDataset(
        [tmp_path / "top4"], expected=None, labels=LabelSettings(True, 2)
    )
    sample = TargetLabeler(LabelSettings(True, 2)).from_predictions(narrower[0])
    assert sample[SOFT_IDS].shape[-1] == sample[SOFT_LOGPROBS].shape[-1] == 2
    # Finishing a folder with other predictions would mix shards: refused too.
    with pytest.raises(FeatureMismatch, match="use a new --out folder"):
        prepare_features(run_config(LABELS), tmp_path / "top4", shard_size=4, progress=False)


@pytest.mark.parametrize("algorithm", ["dflash", "dspark"])
def test_training_from_shards_starts_with_the_in_process_loss(run_config, tmp_path, algorithm):
    """Argmax and soft labels from the stored predictions train as those the in-process target
    computes for each batch (the same samples, anchors and weights; float rounding apart)."""
    from specdraft.trainer.train.assembly import build_trainer

    sections = [
        LABELS,
        SOFT,
        {"model": {"algorithm": algorithm}, "training": {"max_steps": 2, "grad_accum_steps": 2}},
    ]
    in_process = run_config(*sections, {"output_dir": str(tmp_path / "a")})
    prepare_features(in_process, tmp_path / "features", shard_size=4, progress=False)
    features = {"format": "features", "train_paths": [str(tmp_path / "features")]}
    offline = run_config(*sections, {"output_dir": str(tmp_path / "b"), "data": features})
    losses, kls = [], []
    with one_rank() as ctx:
        for config in (in_process, offline):
            trainer = build_trainer(config, ctx, progress=False)
            result = trainer.fit()
            trainer.writer.close()
            losses.append([r.loss for r in result.history])
            kls.append([r.metrics["loss/soft_kl"] for r in result.history])
    assert len(losses[0]) == len(losses[1]) == 2
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    assert kls[1] == pytest.approx(kls[0], rel=1e-5) and min(kls[0]) > 0


def test_packed_rows_take_each_documents_own_labels(run_config, tmp_path):
    """The in-process target labels each document alone, before packing, and stored labels
    are aligned per sample before packing too: a packed row holds at each document's positions
    what the unpacked batch holds for that sample."""
    from specdraft.trainer.data import build_dataset
    from specdraft.trainer.train.sources import BatchBuilder, BatchShape, LocalBatchSource

    corpus = tmp_path / "short.jsonl"
    chats = [("What is the capital of France?", "Paris."), ("Say hi.", "Hi! How can I help?")]
    corpus.write_text(
        "".join(
            json.dumps(
                {"conversations": [{"from": "human", "value": q}, {"from": "gpt", "value": a}]}
            )
            + "\n"
            for q, a in chats
        )
    )
    packing = {"training": {"packing": True}, "data": {"train_paths": [str(corpus)]}}
    config = run_config(LABELS, SOFT, packing)
    dataset, _ = build_dataset(config, split="train", progress=False)
    target = config.model.target
    extractor = TargetFeatureExtractor(target, [0, 2], dtype=torch.float32)
    labeler = TargetLabeler(
        LabelSettings.from_config(config), load_target_head(target, torch.float32).lm_head.weight
    )
    shape = BatchShape(2, 256, 128, False, torch.float32, True, target_labels=True, soft_topk=4)

    def source(policy: ShapePolicy, data=dataset, features=extractor) -> LocalBatchSource:
        builder = BatchBuilder(shapes=policy, shape=shape)
        return LocalBatchSource(
            data, None, builder=builder, grad_accum_steps=1, rank=0,
            features=features, labels=labeler,
        )  # fmt: skip

    short = [0, 1]
    prepare_features(config, tmp_path / "features", shard_size=4, progress=False)
    shards = FeatureShardDataset([tmp_path / "features"], expected=expected_feature_meta(config))
    unpacked = source(ShapePolicy(pad_to=128)).batch(short)
    for packed in (
        source(ShapePolicy.from_config(config)).batch(short),
        source(ShapePolicy.from_config(config), shards, None).batch(short),
    ):
        row = packed["document_ids"][0]
        assert set(row.tolist()) == {-1, 0, 1}, "the two samples share one row"
        for document, index in enumerate(short):
            at = (row == document).nonzero().flatten()
            length = len(dataset[index]["input_ids"])
            for key in (TARGET_LABELS, SOFT_IDS):
                assert torch.equal(packed[key][0, at], unpacked[key][document, :length]), key
            torch.testing.assert_close(
                packed[SOFT_LOGPROBS][0, at], unpacked[SOFT_LOGPROBS][document, :length]
            )
    # Dummy batches (warm-up, empty micro-batches) carry the label keys too.
    dummy = source(ShapePolicy.from_config(config)).builder.empty()
    assert dummy[TARGET_LABELS].shape == dummy["input_ids"].shape
    assert dummy[SOFT_IDS].shape[-1] == 4
