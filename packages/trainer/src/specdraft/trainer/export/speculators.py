"""`--format speculators`: the self-describing format of speculators 0.9.0 (and vLLM's reader).

Read in the installed speculators: `models/dflash/config.py` (DFlashSpeculatorConfig:
`transformer_layer_config`, `draft_vocab_size`, `block_size`, `aux_hidden_state_layer_ids` in
the aux convention of layer_ids.py, `mask_token_id`, `sliding_window_non_causal`,
`sample_from_anchor`), `models/dflash2/config.py` (the conv and selector keys),
`models/dspark/config.py` (the Markov and confidence keys) and `config.py` (`speculators_config`:
algorithm, proposal methods, verifier). Module names equal specdraft's, so model.safetensors is
the sglang export's file, byte for byte; a draft vocabulary adds its `lm_head` rows (saved with
the draft), `draft_vocab_size` and the `t2d` / `d2t` buffers (draft_vocab.py). vLLM converts
this format in `transformers_utils/configs/speculators/algos.py`, which sets
`dflash_config.causal` to `not sliding_window_non_causal` for every layer: written from the
draft's one causality (`model.causal_layers`; a draft whose layers differ is refused; the
window keys are in `transformer_layer_config`, sliding_window.py). The per-family part (model
type, architecture, keys) is the family's `SpeculatorsLayout` in models/<family>/family.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from safetensors.torch import load_file, save_file

from ..models.backbone import DraftModel
from ..models.family_spec import DraftFamily
from .draft_vocab import refuse_draft_vocab, vocab_tensors
from .layer_ids import aux_hidden_state_ids
from .options import ExportOptions
from .sliding_window import layer_window_keys, speculators_non_causal
from .source import ExportRefused

SPECULATORS_VERSION = "0.9.0"
# The draft's HF keys that make up speculators' nested decoder-layer config (a Qwen3Config).
_LAYER_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_parameters",
    "attention_bias",
    "attention_dropout",
    "initializer_range",
)


def verifier_architectures(verifier: str, config: dict[str, Any]) -> list[str]:
    """The verifier's `architectures`, read from a local folder (checked against the draft)."""
    config_file = Path(verifier) / "config.json"
    if not config_file.is_file():
        return []  # a hub id: speculators resolves it when it loads the draft
    target = json.loads(config_file.read_text())
    text = target.get("text_config") or target
    for key in ("vocab_size", "hidden_size"):
        if key in text and int(text[key]) != int(config[key]):
            raise ExportRefused(
                f"--verifier {verifier} has {key} = {text[key]}, the draft {config[key]}: "
                "give the target the draft was trained for (the run's model.target)"
            )
    return list(target.get("architectures") or [])


def speculators_config(
    family: DraftFamily, config: dict[str, Any], verifier: str, architectures: list[str]
) -> dict[str, Any]:
    """speculators' config.json from the draft's own (the dict `save_pretrained` wrote)."""
    layout = family.speculators
    if layout is None:
        raise ExportRefused(
            f"--format speculators has no layout for the {family.name!r} family (speculators "
            "0.9.0 knows dflash, dflash2 and dspark); use --format sglang"
        )
    model_type, architecture = layout.model_type, layout.architecture
    block_size = int(config["block_size"])
    sample_from_anchor = family.sample_from_anchor  # DSpark's slot k predicts anchor + k + 1
    layers = {key: config[key] for key in _LAYER_KEYS if key in config}
    layers.update(model_type="qwen3", tie_word_embeddings=False, **layer_window_keys(config))
    out: dict[str, Any] = {
        "architectures": [architecture],
        "speculators_model_type": model_type,
        "speculators_version": SPECULATORS_VERSION,
        "dtype": config.get("dtype"),
        "transformer_layer_config": layers,
        "draft_vocab_size": int(config.get("draft_vocab_size") or config["vocab_size"]),
        "target_hidden_size": int(config["hidden_size"]),
        "block_size": block_size,
        "aux_hidden_state_layer_ids": aux_hidden_state_ids(config["target_layer_ids"]),
        "mask_token_id": int(config["mask_token_id"]),
        "sliding_window_non_causal": speculators_non_causal(config, "the draft"),
        "sample_from_anchor": sample_from_anchor,
        "speculators_config": {
            "algorithm": model_type,
            "default_proposal_method": "greedy",
            "proposal_methods": [
                {
                    "proposal_type": "greedy",
                    "speculative_tokens": family.supervised_slots(block_size),
                    "verifier_accept_k": 1,
                    "accept_tolerance": 0.0,
                }
            ],
            "verifier": {"name_or_path": verifier, "architectures": architectures},
        },
    }
    out.update(layout.keys(config))
    return out


def write_speculators(model: DraftModel, folder: Path, options: ExportOptions) -> list[str]:
    """Write speculators' config.json beside the unchanged model.safetensors."""
    from ..models import family_of_architecture

    if not options.verifier:
        raise ExportRefused(
            "--format speculators needs --verifier NAME_OR_PATH: the target the draft serves "
            "with (a hub id, or the local folder of the run's model.target), which speculators "
            "records and loads the embeddings and LM head from"
        )
    family = family_of_architecture(type(model).__name__)
    # Refused before anything is written: one causality for every layer, no sink.
    speculators_non_causal(
        {"is_causal": model.config.is_causal, "layer_types": model.config.layer_types},
        options.checkpoint,
    )
    if model.config.attention_sink_bias:
        raise ExportRefused(
            f"{options.checkpoint}: its layers have a learned attention sink "
            "(model.attention_sink_bias) and speculators 0.9.0's DFlash-family configs and "
            "models have none; export it with --format vllm, sglang or gguf"
        )
    if family.speculators is not None:
        refuse_draft_vocab(
            model, "speculators", family.speculators.no_draft_vocab, options.checkpoint
        )
    model.save_pretrained(str(folder), safe_serialization=True)
    config_file = folder / "config.json"
    config = json.loads(config_file.read_text())
    architectures = verifier_architectures(options.verifier, config)
    out = speculators_config(family, config, options.verifier, architectures)
    config_file.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    added = vocab_tensors(model, with_t2d=True)
    if added:
        weights_file = folder / "model.safetensors"
        tensors = {**load_file(str(weights_file)), **added}
        save_file(tensors, str(weights_file), metadata={"format": "pt"})
    return []
