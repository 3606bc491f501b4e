"""What a feature folder records about how it was made, and the check training runs against it.

`prepare-features` writes `feature_meta` into the folder's index; training builds
`expected_feature_meta` from its own config and refuses a folder whose record differs in any of
`MATCHED_FIELDS`, naming each field and the config key it comes from. The target's predictions
a folder holds (`LABEL_FIELDS`: its argmax, its top-K) need not match, only suffice: a run
that trains on them refuses a folder without them (`check_feature_labels`); folders written
before they existed hold none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specdraft.config import Config

from ..integrity import field_mismatches
from ..models.family import family_of
from ..models.target_labels import LabelSettings, stored_predictions

FORMAT_VERSION = 1

# Fields of the index that must match the training config, with the config key they come from.
MATCHED_FIELDS = {
    "target": "model.target",
    "target_layer_ids": "model.target_layer_ids",
    "with_last_hidden": "model.algorithm (dspark needs target_last_hidden_states)",
    "tokenizer": "data.tokenizer",
    "chat_template": "data.chat_template",
    "max_length": "data.max_length",
}


# The target's predictions per position a folder holds, with their value in older folders.
LABEL_FIELDS = {"target_argmax": False, "target_topk": 0}


class FeatureMismatch(ValueError):
    """Offline features were made for a different target, layers, tokenizer or max_length."""


def expected_feature_meta(config: Config) -> dict[str, Any]:
    """The record fields a training config can check without the source corpus."""
    return {
        "target": config.model.target,
        "target_layer_ids": list(config.model.target_layer_ids),
        "with_last_hidden": family_of(config).needs_last_hidden,
        "tokenizer": config.data.tokenizer or config.model.target,
        "chat_template": config.data.chat_template,
        "max_length": config.data.max_length,
    }


def feature_meta(config: Config, data_fingerprint: str) -> dict[str, Any]:
    """The full record a feature folder keeps: the checked fields, the format and the data."""
    argmax, topk = stored_predictions(config)
    return {
        "format_version": FORMAT_VERSION,
        **expected_feature_meta(config),
        "target_argmax": argmax,
        "target_topk": topk,
        "data": data_fingerprint,
    }


def held_labels(meta: dict[str, Any]) -> dict[str, Any]:
    """The predictions a folder's record says it holds (none in folders that predate them)."""
    return {field: meta.get(field, default) for field, default in LABEL_FIELDS.items()}


def check_feature_labels(meta: dict[str, Any], labels: LabelSettings, folder: Path) -> None:
    """Refuse features that lack the target predictions a run trains on, naming each."""
    held, missing = held_labels(meta), []
    if labels.argmax and not held["target_argmax"]:
        missing.append("target_argmax (data.labels = 'target_argmax'): the folder holds no argmax")
    if labels.soft_topk > held["target_topk"]:
        missing.append(
            f"target_topk_ids / target_topk_logprobs (training.soft_label_topk = "
            f"{labels.soft_topk} with soft_label_weight > 0): the folder holds the top "
            f"{held['target_topk']}"
        )
    if missing:
        raise FeatureMismatch(
            f"offline features in {folder} lack the target predictions the config trains on:\n  "
            + "\n  ".join(missing)
            + "\nrun `specdraft prepare-features CONFIG --out NEW_DIR` with this config (it "
            "stores them) and train from NEW_DIR, or train on the tokens (data.labels = "
            "'tokens', training.soft_label_weight = 0)"
        )


def check_feature_meta(meta: dict[str, Any], expected: dict[str, Any], folder: Path) -> None:
    """Refuse features whose record differs from what the config expects, naming each field."""
    diffs = field_mismatches(
        meta,
        expected,
        MATCHED_FIELDS,
        found_label="features have",
        expected_label="config expects",
        notes=MATCHED_FIELDS,
    )
    if diffs:
        raise FeatureMismatch(
            f"offline features in {folder} do not match the config:\n  "
            + "\n  ".join(diffs)
            + "\nrun `specdraft prepare-features` for this config, or point data.train_paths "
            "at features made with these settings"
        )
