"""The target folder of a preset: the cached tiny Qwen3, or a Qwen3-8B-shaped stand-in.

The GPU preset trains on synthetic features, so the target is needed only for its config and
its frozen embedding and LM head. Rather than downloading Qwen3-8B, `qwen3_8b_shaped_target`
writes a folder with Qwen3-8B's config and random bf16 `embed_tokens` / `lm_head` matrices of the
real shapes (151936 x 4096), which costs the same memory and FLOPs as the real ones.
"""

from __future__ import annotations

from pathlib import Path

from .presets import TargetFacts

# Qwen3-8B's public architecture numbers.
QWEN3_8B = {
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "tie_word_embeddings": False,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
}
# As in examples/qwen3-8b-*.toml: five layers spread over the 36, and the first id past Qwen3's
# special tokens as the mask token. Regular (non-special) tokens are the ids below 151643.
QWEN3_8B_LAYER_IDS = (1, 9, 17, 25, 33)
QWEN3_8B_MASK_TOKEN_ID = 151669
QWEN3_REGULAR_VOCAB = 151643
# The tiny target has 4 layers; the last one may not be tapped.
TINY_LAYER_IDS = (0, 1, 2)
_DONE = ".complete"


def tiny_target() -> TargetFacts:
    """The cached tiny Qwen3 target (built on first use, about a minute and a half)."""
    from specdraft.trainer.assets import build_tiny_target, tiny_assets_info

    info = tiny_assets_info()
    return TargetFacts(
        path=str(build_tiny_target()),
        layer_ids=TINY_LAYER_IDS,
        mask_token_id=info.mask_token_id,
        vocab_size=info.mask_token_id,  # every id below the specials is a regular token
    )


def qwen3_8b_shaped_target(folder: Path) -> TargetFacts:
    """Write (once) a Qwen3-8B-shaped target folder with random frozen embedding and LM head."""
    facts = TargetFacts(
        path=str(folder),
        layer_ids=QWEN3_8B_LAYER_IDS,
        mask_token_id=QWEN3_8B_MASK_TOKEN_ID,
        vocab_size=QWEN3_REGULAR_VOCAB,
    )
    if (folder / _DONE).is_file():
        return facts
    import torch
    from safetensors.torch import save_file
    from transformers import Qwen3Config

    folder.mkdir(parents=True, exist_ok=True)
    config = Qwen3Config(**QWEN3_8B)
    config.architectures = ["Qwen3ForCausalLM"]
    config.to_json_file(str(folder / "config.json"))
    device = "cuda" if torch.cuda.is_available() else "cpu"
    shape = (QWEN3_8B["vocab_size"], QWEN3_8B["hidden_size"])
    generator = torch.Generator(device=device).manual_seed(0)
    tensors = {
        # The init scale of Qwen3 (initializer_range 0.02), so logits have a realistic spread.
        name: (torch.randn(shape, generator=generator, device=device) * 0.02)
        .to(torch.bfloat16)
        .cpu()
        for name in ("model.embed_tokens.weight", "lm_head.weight")
    }
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / _DONE).write_text("random embed_tokens and lm_head; not a usable model\n")
    return facts
