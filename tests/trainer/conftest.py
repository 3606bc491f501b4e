"""Fixtures of the trainer tests. Each block below belongs to one area; keep them independent."""

from __future__ import annotations

import pytest
import torch

# -------------------------------------------------------------------------- draft models
# A ModelConfig factory for the tiny random Qwen3 target (`tiny_qwen3_target`, tests/conftest.py),
# and a batch factory that computes each sample's target features at its own length and
# zero-pads them, as the collator does, so a sample's features are bit-identical whatever it is
# padded to.


@pytest.fixture
def draft_model_config(tiny_qwen3_target):
    """Factory: a specdraft ModelConfig for the tiny target, `algorithm` plus overrides."""
    from specdraft.config.schema import ModelConfig

    def make(algorithm: str, **overrides):
        values = {
            "target": tiny_qwen3_target.path,
            "algorithm": algorithm,
            "block_size": 4,
            "num_draft_layers": 2,
            "target_layer_ids": list(tiny_qwen3_target.layer_ids),
            "mask_token_id": tiny_qwen3_target.mask_token_id,
            "dflash2": {
                "selector_gold_policy": "exclude",
                "conv_group_size": 8,
                "selector_top_k": 4,
                "selector_rank": 8,
            },
            "dspark": {"markov_rank": 8},
        }
        for key, value in overrides.items():
            if isinstance(value, dict) and isinstance(values.get(key), dict):
                values[key] = {**values[key], **value}
            else:
                values[key] = value
        return ModelConfig(**values)

    return make


def feature_batch(extractor, samples, pad_to: int, dtype: torch.dtype = torch.float32) -> dict:
    """Collate samples [(input_ids [L], loss_mask [L], sample_id)] with the extractor's target
    features, each computed at the sample's own length, zero-padded to `pad_to`."""
    rows = {"input_ids": [], "loss_mask": [], "hidden_states": [], "last": []}
    for input_ids, loss_mask, _ in samples:
        length = input_ids.shape[0]
        features, last = extractor(input_ids[None], torch.ones(1, length, dtype=torch.long))
        pad = pad_to - length
        rows["input_ids"].append(torch.nn.functional.pad(input_ids, (0, pad)))
        rows["loss_mask"].append(torch.nn.functional.pad(loss_mask, (0, pad)))
        rows["hidden_states"].append(torch.nn.functional.pad(features[0], (0, 0, 0, pad)))
        rows["last"].append(torch.nn.functional.pad(last[0], (0, 0, 0, pad)))
    return {
        "input_ids": torch.stack(rows["input_ids"]),
        "loss_mask": torch.stack(rows["loss_mask"]),
        "hidden_states": torch.stack(rows["hidden_states"]).to(dtype),
        "target_last_hidden_states": torch.stack(rows["last"]).to(dtype),
        "sample_id": torch.tensor([sid for _, _, sid in samples], dtype=torch.long),
    }


@pytest.fixture
def make_draft_batch(tiny_qwen3_target):
    """Factory: collate samples [(input_ids [L], loss_mask [L], sample_id)] padded to `pad_to`."""
    from specdraft.trainer.models import TargetFeatureExtractor

    extractor = TargetFeatureExtractor(tiny_qwen3_target.model, list(tiny_qwen3_target.layer_ids))

    def make(samples, pad_to: int, dtype: torch.dtype = torch.float32) -> dict:
        return feature_batch(extractor, samples, pad_to, dtype)

    return make


@pytest.fixture
def random_samples(tiny_qwen3_target):
    """Factory: `count` random samples with a prompt prefix unsupervised and a gap or two."""

    def make(lengths: list[int], seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        samples = []
        for index, length in enumerate(lengths):
            ids = torch.randint(0, tiny_qwen3_target.mask_token_id, (length,), generator=generator)
            mask = torch.ones(length, dtype=torch.long)
            mask[: max(1, length // 4)] = 0  # the prompt
            if length > 12:
                mask[length // 2] = 0  # a user turn between two assistant turns
            samples.append((ids, mask, 1000 + 7 * index + seed))
        return samples

    return make


# ----------------------------------------------------------------------- conversation data
# A Config factory for data tests, on the tiny tokenizer (`tiny_tokenizer_path`, tests/conftest.py).


@pytest.fixture
def data_config(tiny_tokenizer_path, tmp_path):
    """Factory: a valid Config whose [data] table is `data` (the tokenizer is the tiny one and
    the dataset cache is private to the test unless `cache_dir` is given)."""
    from specdraft.config import validate_config
    from specdraft.trainer.assets import tiny_assets_info

    def make(**data):
        info = tiny_assets_info()
        data.setdefault("cache_dir", str(tmp_path / "cache"))
        data.setdefault("train_paths", ["pkg:sharegpt"])
        return validate_config(
            {
                "model": {
                    "target": str(tiny_tokenizer_path),
                    "algorithm": "dspark",
                    "target_layer_ids": [0, 1, 2],
                    "mask_token_id": info.mask_token_id,
                },
                "data": data,
            }
        )

    return make


# --------------------------------------------------------------------------- Llama targets
# A batch factory on the random tied Llama (`tiny_llama_target`, tests/conftest.py).


@pytest.fixture
def make_llama_batch(tiny_llama_target):
    """Factory: collate samples with the tiny Llama's features, padded to `pad_to`."""
    from specdraft.trainer.models import TargetFeatureExtractor

    extractor = TargetFeatureExtractor(tiny_llama_target.model, list(tiny_llama_target.layer_ids))

    def make(samples, pad_to: int) -> dict:
        return feature_batch(extractor, samples, pad_to)

    return make
