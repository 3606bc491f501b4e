"""SGLang plugin for specdraft's capture servers, loaded through SGLang's `sglang.srt.plugins`
entry point and its `HookRegistry`.

Two hooks, both on SGLang 0.5.23's own methods (a plugin built for another SGLang refuses to
load, naming both versions, rather than wrap a method whose signature may have changed):

- `LogitsProcessor.forward` (AFTER): the target's post-norm final hidden state after the
  tapped layers. 0.5.23 keeps it (`LogitsProcessorOutput.last_hidden_states`, under
  `--enable-return-aux-hidden-states`) "for in-process consumers" and never copies it into the
  response; appending it to the aux rows carries it, per prefill token and chunk, as far as
  the scheduler's hand-off below (DSpark trains on it).
- `SchedulerBatchResultProcessor._append_prefill_hidden_states` (AROUND), only when the
  launcher handed the plugin a run's settings ($SPECDRAFT_SGLANG_CAPTURE): for a request of
  that run (its id tagged with the run's secret), the rows of every prefill chunk go into one
  buffer and then, as raw bytes, into the run's feature store; `meta_info` carries only their
  reference. No float crosses JSON. Every other request is left to stock SGLang (`feature_store`).
"""

from __future__ import annotations

from typing import Any

__version__ = "0.2.0"
# The SGLang release whose source these hooks were written against (and are tested on).
BUILT_FOR_SGLANG = "0.5.23"
TARGET = "sglang.srt.layers.logits_processor.LogitsProcessor.forward"
# The environment variable naming the settings file (`specdraft...wire.sglang` writes it).
CONFIG_ENV = "SPECDRAFT_SGLANG_CAPTURE"


class WrongSGLangVersion(RuntimeError):
    """The plugin was built for another SGLang release than the one installed."""


def installed_sglang_version() -> str:
    """The version of the SGLang distribution installed next to the plugin."""
    from importlib.metadata import version

    return version("sglang")


def check_sglang_version(installed: str) -> None:
    """Refuse an SGLang other than the one the hooks were built for, naming both versions."""
    if installed != BUILT_FOR_SGLANG:
        raise WrongSGLangVersion(
            f"specdraft-sglang-plugin {__version__} was built for SGLang {BUILT_FOR_SGLANG} and "
            f"refuses to hook SGLang {installed}: the methods it wraps may have changed. Install "
            f"the specdraft-sglang-plugin built for SGLang {installed} (or run SGLang "
            f"{BUILT_FOR_SGLANG}); until then specdraft captures through the slower JSON path"
        )


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
    """Entry point SGLang calls at start-up: check the version, then register the hooks."""
    import os

    check_sglang_version(installed_sglang_version())
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, append_final_state, HookType.AFTER)
    path = os.environ.get(CONFIG_ENV)
    if path:
        from .feature_store import FEATURES_TARGET, capture_prefill_rows, enable

        enable(path)
        HookRegistry.register(FEATURES_TARGET, capture_prefill_rows, HookType.AROUND)
