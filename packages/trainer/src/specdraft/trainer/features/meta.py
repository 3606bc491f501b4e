"""What a feature folder records about how it was made, and the check training runs against it.

`prepare-features` writes `feature_meta` into the folder's index; training builds
`expected_feature_meta` from its own config and refuses a folder whose record differs in any of
`MATCHED_FIELDS`, naming each field and the config key it comes from.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from specdraft.config import Config

from ..integrity import field_mismatches
from ..models.family import family_of

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
    return {
        "format_version": FORMAT_VERSION,
        **expected_feature_meta(config),
        "data": data_fingerprint,
    }


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
