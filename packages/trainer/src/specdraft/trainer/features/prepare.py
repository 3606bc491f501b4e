"""`specdraft prepare-features`: run the target once over the corpus and write feature shards."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from specdraft.config import Config, ShapePolicy

from ..models.family import family_of
from ..models.target_labels import target_predictions
from .meta import FeatureMismatch, check_feature_meta, feature_meta, held_labels
from .shards import read_index, write_index, write_shard

if TYPE_CHECKING:
    from datasets import Dataset

    from ..models.target import TargetFeatureExtractor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrepareResult:
    """What a prepare-features call did."""

    folder: Path
    num_samples: int
    shards_written: int
    shards_skipped: int


def prepare_features(
    config: Config,
    out_dir: str | Path,
    *,
    shard_size: int = 256,
    batch_size: int = 4,
    progress: bool = True,
    device: torch.device | None = None,
) -> PrepareResult:
    """Write (or finish) the feature shards of the config's training corpus into `out_dir`."""
    from ..data import build_dataset
    from ..models import TargetFeatureExtractor, target_dtype

    if shard_size < 1:
        raise ValueError(f"--shard-size must be at least 1, not {shard_size}")
    folder = Path(out_dir)
    folder.mkdir(parents=True, exist_ok=True)
    dataset, report = build_dataset(config, split="train", progress=progress)
    meta = feature_meta(config, report.fingerprint)
    index = read_index(folder)
    if index is None:
        index = {"meta": meta, "shards": [], "complete": False, "shard_size": shard_size}
    else:
        check_feature_meta(index["meta"], meta, folder)
        # Every shard of a folder holds the same predictions.
        if held_labels(index["meta"]) != held_labels(meta):
            raise FeatureMismatch(
                f"{folder} was started with the target predictions {held_labels(index['meta'])}, "
                f"this config stores {held_labels(meta)} (data.labels, "
                "training.soft_label_topk): use a new --out folder"
            )
        if index["meta"].get("data") != meta["data"]:
            raise FeatureMismatch(
                f"{folder} holds features of different data (data.train_paths, "
                f"data.max_samples or the tokenizer changed: fingerprint "
                f"{index['meta'].get('data')} vs {meta['data']}): use a new --out folder"
            )
        # Shard k holds samples k*size..(k+1)*size-1: another size would skip or repeat some.
        if index.get("shard_size") != shard_size:
            raise FeatureMismatch(
                f"{folder} was started with --shard-size {index.get('shard_size')}, not "
                f"{shard_size}: resume with --shard-size {index.get('shard_size')}"
            )
    done = len(index["shards"])
    total_shards = -(-len(dataset) // shard_size)
    if done < total_shards:
        device = device or torch.device("cuda" if torch.cuda.is_available() else "cpu")
        # The dtype training uses for in-process features, so both give the same batches.
        extractor = TargetFeatureExtractor(
            config.model.target,
            list(config.model.target_layer_ids),
            dtype=target_dtype(device),
            device=device,
        )
    # prepare-features is its own run: its one shape policy pads like training will.
    shapes = ShapePolicy.from_config(config)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        initial = min(len(dataset), done * shard_size)
        bar = tqdm(total=len(dataset), initial=initial, desc="features", unit="sample")
    for shard in range(done, total_shards):
        rows = dataset.select(
            range(shard * shard_size, min(len(dataset), (shard + 1) * shard_size))
        )
        samples = _features_of(
            rows, extractor, config, batch_size=batch_size, shapes=shapes, meta=meta
        )
        record = write_shard(folder, shard, samples)
        index["shards"].append(record.__dict__)
        write_index(folder, index)
        if bar is not None:
            bar.update(record.num_samples)
    index["complete"] = True
    write_index(folder, index)
    if bar is not None:
        bar.close()
    return PrepareResult(folder, len(dataset), total_shards - done, done)


def _features_of(
    rows: Dataset,
    extractor: TargetFeatureExtractor,
    config: Config,
    *,
    batch_size: int,
    shapes: ShapePolicy,
    meta: dict,
) -> list[dict[str, torch.Tensor]]:
    """Run the target on rows in small batches; cut each sample's features to its own length.

    With the target's predictions in `meta` (data.labels, soft labels) each sample also gets
    its argmax and top-K per position, from the target's own LM head on its normed last
    hidden state: the logits of the same forward, one matmul more.
    """
    with_last = family_of(config).needs_last_hidden
    held = held_labels(meta)
    head = extractor.model.get_output_embeddings().weight if held["target_argmax"] else None
    samples: list[dict[str, torch.Tensor]] = []
    for start in range(0, len(rows), batch_size):
        batch_rows = [rows[i] for i in range(start, min(len(rows), start + batch_size))]
        lengths = [len(r["input_ids"]) for r in batch_rows]
        # The same pad policy as training: target features of a padded batch equal those of
        # the unpadded samples (causal attention, right padding), and shapes stay few.
        width = shapes.pad_length(max(lengths))
        ids = torch.zeros(len(batch_rows), width, dtype=torch.long)
        mask = torch.zeros(len(batch_rows), width, dtype=torch.long)
        for i, row in enumerate(batch_rows):
            ids[i, : lengths[i]] = torch.tensor(row["input_ids"])
            mask[i, : lengths[i]] = 1
        with torch.no_grad():
            device = extractor.model.device
            hidden, last = extractor(ids.to(device), mask.to(device))
        for i, row in enumerate(batch_rows):
            n = lengths[i]
            sample = {
                "input_ids": torch.tensor(row["input_ids"], dtype=torch.long),
                "loss_mask": torch.tensor(row["loss_mask"], dtype=torch.long),
                "hidden_states": hidden[i, :n].to("cpu"),
                "sample_id": torch.tensor(int(row["sample_id"]), dtype=torch.long),
            }
            if with_last:
                sample["target_last_hidden_states"] = last[i, :n].to("cpu")
            if head is not None:
                predicted = target_predictions(last[i, :n], head, held["target_topk"])
                sample.update({key: value.to("cpu") for key, value in predicted.items()})
            samples.append(sample)
    return samples
