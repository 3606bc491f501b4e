"""SGLang plugin: the target's post-norm final hidden state in `/generate`'s hidden states.

SGLang 0.5.23's `LogitsProcessor.forward` returns a `LogitsProcessorOutput` whose
`hidden_states` are the concatenated aux layers (`--enable-return-aux-hidden-states`, full
capture) and whose `last_hidden_states` hold the post-norm final state of the same tokens, kept
"for in-process consumers" and never copied into the response. The scheduler slices
`hidden_states` per request into `meta_info.hidden_states`; appending the final state to those
rows is the smallest change that carries it over HTTP, per prefill token and chunk, trimmed
like the aux rows.
"""

from __future__ import annotations

from typing import Any

TARGET = "sglang.srt.layers.logits_processor.LogitsProcessor.forward"


def append_final_state(result: Any, *_args: Any, **_kwargs: Any) -> Any:
    """AFTER hook: rows of [aux layers | final state]; untouched when either is missing."""
    hidden = getattr(result, "hidden_states", None)
    last = getattr(result, "last_hidden_states", None)
    # Only full aux capture keeps last_hidden_states; a row-count mismatch means a subset of
    # rows was captured (hidden_states_token_indices), where the two do not line up.
    if hidden is None or last is None or hidden.shape[:-1] != last.shape[:-1]:
        return None
    import torch

    result.hidden_states = torch.cat([hidden, last.to(hidden.dtype)], dim=-1)
    return result


def register() -> None:
    """Entry point SGLang calls at start-up: hook LogitsProcessor.forward."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, append_final_state, HookType.AFTER)
