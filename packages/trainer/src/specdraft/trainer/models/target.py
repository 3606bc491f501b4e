"""The frozen target: its embedding and LM head (read alone from safetensors) and its features.

Training needs only two matrices of the target when the features come from elsewhere (offline
files or a capture server): `embed_tokens` to embed the draft blocks and `lm_head` for the
logits. `load_target_head` reads just those tensors from the safetensors files (single file or
sharded index), never the whole model. `TargetFeatureExtractor` runs the whole target in-process
when the features are computed on the fly.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

# Where a causal LM's safetensors keep the embedding and the LM head (also read by the pre-start
# check of `specdraft train`, train/preflight.py).
EMBED_KEYS = ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight")
HEAD_KEYS = ("lm_head.weight", "model.lm_head.weight")
_SINGLE_FILE = "model.safetensors"
_INDEX_FILE = "model.safetensors.index.json"


def target_dtype(device: torch.device) -> torch.dtype:
    """The frozen target runs in bf16 on GPU and fp32 on CPU."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


class TargetHead(nn.Module):
    """Frozen `embed_tokens` (nn.Embedding) and `lm_head` (nn.Linear, no bias) of the target.

    No final norm: `target_last_hidden_states` are already normed, and the draft applies its own
    norm before the head.
    """

    def __init__(self, embed_weight: Tensor, head_weight: Tensor | None) -> None:
        super().__init__()
        vocab, hidden = embed_weight.shape
        self.embed_tokens = nn.Embedding(vocab, hidden, _weight=embed_weight, _freeze=True)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        if head_weight is None:
            # Tied embeddings: share the one matrix instead of holding it twice.
            self.lm_head.weight = self.embed_tokens.weight
        else:
            if head_weight.shape != embed_weight.shape:
                raise ValueError(
                    f"lm_head.weight {tuple(head_weight.shape)} and embed_tokens.weight "
                    f"{tuple(embed_weight.shape)} disagree: is this a causal LM checkpoint?"
                )
            self.lm_head.weight = nn.Parameter(head_weight, requires_grad=False)
        self.requires_grad_(False)

    @property
    def vocab_size(self) -> int:
        """Rows of the embedding (the target vocabulary)."""
        return self.embed_tokens.num_embeddings

    @property
    def hidden_size(self) -> int:
        """Width of the target's hidden states."""
        return self.embed_tokens.embedding_dim

    def embed(self, input_ids: Tensor) -> Tensor:
        """Embed token ids [..] -> [.., H] with the frozen target embedding."""
        return self.embed_tokens(input_ids)

    def logits(self, hidden: Tensor) -> Tensor:
        """Full-vocabulary logits of hidden states [.., H] in the head's dtype."""
        return self.lm_head(hidden.to(self.lm_head.weight.dtype))


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path}: not found; model.target must be a local HF folder with config.json and "
            "safetensors weights"
        ) from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None


def tensor_files(folder: Path) -> dict[str, Path]:
    """Map every tensor name to the safetensors file that holds it."""
    index = folder / _INDEX_FILE
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict):
            raise ValueError(f"{index}: has no 'weight_map'; re-save the target")
        return {name: folder / file for name, file in weight_map.items()}
    single = folder / _SINGLE_FILE
    if single.is_file():
        from safetensors import safe_open

        with safe_open(str(single), framework="pt") as handle:
            return dict.fromkeys(handle.keys(), single)
    raise FileNotFoundError(
        f"{folder}: neither {_SINGLE_FILE} nor {_INDEX_FILE} found; model.target must point "
        "at safetensors weights (convert .bin checkpoints with save_pretrained)"
    )


def _read_tensor(name: str, file: Path) -> Tensor:
    from safetensors import safe_open

    with safe_open(str(file), framework="pt") as handle:
        return handle.get_tensor(name)


def _first_present(names: tuple[str, ...], files: dict[str, Path]) -> str | None:
    for name in names:
        if name in files:
            return name
    return None


def load_target_config(path: str | Path) -> Any:
    """The target's HF config from a local folder (no hub access)."""
    from transformers import AutoConfig

    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"{folder / 'config.json'}: not found; model.target must be a local HF model folder"
        )
    return AutoConfig.from_pretrained(str(folder), local_files_only=True)


def load_target_head(path: str | Path, dtype: torch.dtype = torch.bfloat16) -> TargetHead:
    """Read only `embed_tokens` and `lm_head` of the target at `path` into a frozen TargetHead."""
    folder = Path(path)
    config = _read_json(folder / "config.json")
    text = config.get("text_config", config)
    tied = bool(text.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
    files = tensor_files(folder)
    embed_name = _first_present(EMBED_KEYS, files)
    if embed_name is None:
        raise KeyError(
            f"{folder}: no embedding tensor ({' or '.join(EMBED_KEYS)}) in the safetensors "
            "files; is model.target a causal LM?"
        )
    embed = _read_tensor(embed_name, files[embed_name]).to(dtype)
    head_name = _first_present(HEAD_KEYS, files)
    if head_name is None and not tied:
        raise KeyError(
            f"{folder}: no lm_head.weight in the safetensors files and config.json does not set "
            "tie_word_embeddings; the checkpoint is incomplete"
        )
    head = None if head_name is None or tied else _read_tensor(head_name, files[head_name])
    return TargetHead(embed, None if head is None else head.to(dtype))


class TargetFeatureExtractor:
    """Runs the target in-process and returns the draft's features for a batch.

    `__call__(input_ids, attention_mask) -> (hidden_states [B, S, L*H], last_hidden [B, S, H])`:
    the outputs of decoder layers `layer_ids` (HF `hidden_states[k + 1]`) concatenated, and the
    final normed hidden state (HF `hidden_states[-1]`).
    """

    def __init__(
        self,
        model: str | Path | nn.Module,
        layer_ids: list[int],
        *,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str | None = None,
    ) -> None:
        if isinstance(model, (str, Path)):
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(
                str(model), dtype=dtype, local_files_only=True
            )
        if device is not None:
            model = model.to(device)
        self.model = model.eval().requires_grad_(False)
        # The decoder alone: the LM head's [B, S, V] logits are never needed here.
        self.decoder = getattr(model, "model", model)
        num_layers = int(model.config.get_text_config().num_hidden_layers)
        for layer in layer_ids:
            if not 0 <= layer < num_layers - 1:
                raise ValueError(
                    f"model.target_layer_ids contains {layer}: the target has {num_layers} "
                    f"layers, so use ids in 0..{num_layers - 2} (the last layer is not allowed)"
                )
        self.layer_ids = list(layer_ids)

    @torch.no_grad()
    def __call__(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        """Target features of a batch: (hidden_states [B, S, L*H], last_hidden [B, S, H])."""
        out = self.decoder(
            input_ids=input_ids,
            attention_mask=attention_mask,
            output_hidden_states=True,
            use_cache=False,
        )
        # hidden_states[k + 1] is the output of decoder layer k, except the last entry, which HF
        # replaces by the normed final state: hence "not the last layer".
        states = out.hidden_states
        features = torch.cat([states[k + 1] for k in self.layer_ids], dim=-1)
        return features, out.last_hidden_state
