"""Offline feature shards: target features written once, read by training without the target.

A feature folder holds `shard-00000.safetensors`, ... and `index.json`. Each shard stores, per
sample k, `k.input_ids`, `k.loss_mask`, `k.hidden_states` ([S, L*H]), for DSpark also
`k.target_last_hidden_states` ([S, H]), and `k.sample_id`; with labels from the target's
predictions also `k.target_argmax` ([S] int32), `k.target_topk_ids` ([S, K] int32) and
`k.target_topk_logprobs` ([S, K] float32), prediction-aligned (models/target_labels.py). The
index records what the features were made with (target, layer ids, tokenizer, chat template,
max_length, data, the predictions held) and each finished shard with its sha256, and is
rewritten atomically after every shard: an interrupted `prepare-features` resumes at the first
unfinished shard. Training refuses a folder whose record
differs from its config, and a shard whose bytes differ from its recorded sha256 (checked when
the shard is first opened, naming the file).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from ..integrity import CorruptFile, sha256_file
from ..runtime.atomic import atomic_path, atomic_write
from .meta import FeatureMismatch, check_feature_labels, check_feature_meta

if TYPE_CHECKING:
    from ..models.target_labels import LabelSettings

log = logging.getLogger(__name__)

INDEX = "index.json"


@dataclass(frozen=True)
class ShardRecord:
    """One finished shard: its file and the samples it holds."""

    file: str
    num_samples: int
    lengths: list[int]
    sha256: str


def shard_name(index: int) -> str:
    """File name of shard `index`."""
    return f"shard-{index:05d}.safetensors"


def read_index(folder: Path) -> dict[str, Any] | None:
    """The index of a feature folder, or None when there is none yet."""
    path = folder / INDEX
    if not path.is_file():
        return None
    return json.loads(path.read_text())


def write_index(folder: Path, index: dict[str, Any]) -> None:
    """Rewrite the index atomically (tmp + rename)."""
    atomic_write(folder / INDEX, json.dumps(index, indent=1, sort_keys=True))


def write_shard(
    folder: Path, index: int, samples: Sequence[dict[str, torch.Tensor]]
) -> ShardRecord:
    """Write one shard atomically and return its record."""
    tensors: dict[str, torch.Tensor] = {}
    lengths = []
    for k, sample in enumerate(samples):
        length = int(sample["input_ids"].shape[0])
        lengths.append(length)
        for name, value in sample.items():
            tensors[f"{k}.{name}"] = value.detach().to("cpu").contiguous()
    name = shard_name(index)
    with atomic_path(folder / name) as tmp:
        save_file(tensors, str(tmp), metadata={"num_samples": str(len(samples))})
        digest = sha256_file(tmp)
    return ShardRecord(name, len(samples), lengths, digest)


class FeatureShardDataset(torch.utils.data.Dataset):
    """Random access to the samples of one or more feature folders.

    `expected` (the config's feature record) and `labels` (the target predictions the run
    trains on) refuse folders made otherwise, before any shard is read.
    """

    def __init__(
        self,
        folders: Sequence[str | Path],
        *,
        expected: dict[str, Any] | None,
        labels: LabelSettings | None = None,
    ) -> None:
        self._entries: list[tuple[Path, int]] = []
        # Recorded sha256 per shard file (None for folders written before checksums).
        self._sha256: dict[Path, str | None] = {}
        self.lengths: list[int] = []
        self.meta: dict[str, Any] = {}
        for folder in map(Path, folders):
            index = read_index(folder)
            if index is None:
                raise FileNotFoundError(
                    f"{folder} holds no {INDEX}: it is not a feature folder; write one with "
                    "`specdraft prepare-features CONFIG`"
                )
            if expected is not None:
                check_feature_meta(index["meta"], expected, folder)
            if labels is not None:
                check_feature_labels(index["meta"], labels, folder)
            if not index.get("complete", False):
                raise FeatureMismatch(
                    f"features in {folder} are incomplete ({len(index['shards'])} shards so far): "
                    "finish them with `specdraft prepare-features` (it resumes)"
                )
            self.meta = index["meta"]
            for shard in index["shards"]:
                self._sha256[folder / shard["file"]] = shard.get("sha256")
                for k in range(shard["num_samples"]):
                    self._entries.append((folder / shard["file"], k))
                self.lengths.extend(shard["lengths"])
        self._handles: dict[Path, Any] = {}

    def __len__(self) -> int:
        return len(self._entries)

    def anchor_counts(self) -> list[int]:
        """Valid anchors of every sample, read from the shards' loss masks only."""
        from specdraft.collate import valid_anchor_count

        counts = []
        for path, k in self._entries:
            handle = self._handles.get(path)
            if handle is None:
                self.verify_shard(path)
                handle = self._handles[path] = safe_open(str(path), framework="pt")
            counts.append(valid_anchor_count(handle.get_tensor(f"{k}.loss_mask").tolist()))
        return counts

    def token_columns(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(input_ids, loss_mask) of every sample, flat per shard (token counts, no features)."""
        by_shard: dict[Path, list[int]] = {}
        for path, k in self._entries:
            by_shard.setdefault(path, []).append(k)
        for path, samples in by_shard.items():
            handle = self._handles.get(path)
            if handle is None:
                self.verify_shard(path)
                handle = self._handles[path] = safe_open(str(path), framework="pt")
            ids = [handle.get_tensor(f"{k}.input_ids").numpy().ravel() for k in samples]
            mask = [handle.get_tensor(f"{k}.loss_mask").numpy().ravel() for k in samples]
            yield np.concatenate(ids), np.concatenate(mask)

    def verify_shard(self, path: Path) -> None:
        """Check a shard against the sha256 its index recorded; refuse it naming the file."""
        expected = self._sha256.get(path)
        if expected is None:
            log.warning(
                "%s has no recorded checksum (written by an older prepare-features): it is "
                "read unverified; re-run prepare-features into a new folder to add checksums",
                path,
            )
            return
        if sha256_file(path) != expected:
            raise CorruptFile(
                f"{path}: content differs from the sha256 recorded in {path.parent / INDEX} "
                "(corrupted or modified after it was written); re-run `specdraft "
                "prepare-features` into a new folder, or restore this file"
            )

    def __getitem__(self, item: int) -> dict[str, torch.Tensor]:
        path, k = self._entries[item]
        handle = self._handles.get(path)
        if handle is None:
            self.verify_shard(path)
            handle = self._handles[path] = safe_open(str(path), framework="pt")
        prefix = f"{k}."
        return {
            key[len(prefix) :]: handle.get_tensor(key)
            for key in handle.keys()  # noqa: SIM118 - safe_open is not a dict
            if key.startswith(prefix)
        }
