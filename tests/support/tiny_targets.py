"""The one way to build each tiny target the tests use; the fixtures are in tests/conftest.py.

- the pretrained tiny Qwen3 (real answers, its own tokenizer): `specdraft.trainer.assets.
  build_tiny_target()`, cached under build/cache; the `tiny_target_path` fixture;
- a random Qwen3 (`save_random_qwen3`): the draft-model tests' 4-layer hidden-32 target
  (`tiny_qwen3_target`) and the disaggregated runtime's hidden-64 one
  (`disagg_support.build_random_target`);
- a random tied Llama (`save_random_llama`): `tiny_llama_target`, and with SmolLM2's vocabulary
  and tokenizer files (`SMOLLM2_TOKENIZER_FILES`) `smollm2_tokenizer_target`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

# The SmolLM2 asset's tokenizer files a random Llama with SmolLM2's vocabulary is given.
SMOLLM2_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


@dataclasses.dataclass(frozen=True)
class TinyTarget:
    """A random tiny causal LM on disk and in memory."""

    path: str
    model: object
    vocab_size: int
    mask_token_id: int
    layer_ids: tuple[int, ...]


def save_random_qwen3(
    folder: Path,
    *,
    vocab_size: int,
    hidden_size: int,
    intermediate_size: int,
    num_layers: int,
    head_dim: int,
    max_positions: int,
    seed: int,
):
    """Save a random untied Qwen3ForCausalLM (GQA 4/2) drawn after `torch.manual_seed(seed)`;
    the model, in eval mode."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=head_dim,
        max_position_embeddings=max_positions,
        tie_word_embeddings=False,
    )
    model = Qwen3ForCausalLM(config).eval()
    model.save_pretrained(folder)
    return model


def save_random_llama(folder: Path, vocab_size: int, *, num_layers: int = 5, seed: int = 7):
    """Save a random tied LlamaForCausalLM (hidden 32, GQA 4/2) and its generation config.

    Tied embeddings (its safetensors hold model.embed_tokens.weight and no lm_head), SmolLM2's
    RoPE theta 1e5 and eps 1e-5 (Qwen3's defaults are 1e6 and 1e-6) and its special ids (bos 1,
    eos = pad 2)."""
    import torch
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
