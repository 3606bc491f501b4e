"""Target layer ids in each engine's convention (read in the installed engines' own code).

specdraft's `model.target_layer_ids` entry k is the output of target decoder layer k (0-based),
which is HF's `hidden_states[k + 1]` (`hidden_states[0]` is the embedding output). The engines:

- SGLang 0.5.23 (`srt/models/qwen3.py`, `set_dflash_layers_to_capture`) and vLLM 0.32
  (`model_executor/models/qwen3_dflash.py` reading `dflash_config.target_layer_ids`) take the
  same k and capture before layer k + 1 themselves: no shift in the config.
- vLLM's aux hidden-state ids (`v1/worker/gpu/spec_decode/eagle/eagle3_utils.py`,
  `get_eagle3_aux_layers_from_config`: `i + 1` of `dflash_config.target_layer_ids`, and of a
  top-level `target_layer_ids` for Qwen3 DSpark) count the state after j layers, so j = k + 1;
  `models/qwen2.py` records id `idx + 1` after decoder layer `idx`.
- speculators 0.9.0's `aux_hidden_state_layer_ids` use that aux convention, k + 1 (vLLM's
  `transformers_utils/configs/speculators/algos.py` converts them back with `i - 1`, and
  speculators' `resolve_target_layer_ids` accepts ids up to num_hidden_layers, the final state).
"""

from __future__ import annotations

from collections.abc import Sequence


def engine_layer_ids(layer_ids: Sequence[int]) -> list[int]:
    """SGLang's and vLLM's `target_layer_ids` (dflash_config): specdraft's ids unchanged."""
    return [int(k) for k in layer_ids]


def aux_hidden_state_ids(layer_ids: Sequence[int]) -> list[int]:
    """vLLM's aux hidden-state ids and speculators' `aux_hidden_state_layer_ids`: k + 1."""
    return [int(k) + 1 for k in layer_ids]
