"""Target layers by measurement: every layer's states, probes of them, the taps to suggest."""

from .collect import LayerStates, collect_layer_states, probe_positions
from .explain import LayerProbeSettings, explain_layers
from .probe import ANCHOR, ProbeScore, RidgeProbe, early_exit_scores, offset_weights
from .report import render_layers_text
from .select import SelectionStep, candidate_layers, greedy_layers, rank_layers

__all__ = [
    "ANCHOR",
    "LayerProbeSettings",
    "LayerStates",
    "ProbeScore",
    "RidgeProbe",
    "SelectionStep",
    "candidate_layers",
    "collect_layer_states",
    "early_exit_scores",
    "explain_layers",
    "greedy_layers",
    "offset_weights",
    "probe_positions",
    "rank_layers",
    "render_layers_text",
]
