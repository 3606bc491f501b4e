"""The transformers target behind the embedded capture server and the SGLang stub.

A thin, thread-safe wrapper of `models.target.TargetFeatureExtractor`, so capture features are
computed exactly as the in-process (local) path computes them: layer k of
`model.target_layer_ids` is HF `hidden_states[k + 1]`, the final state the normed last one.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import torch

from specdraft.trainer.models.target import TargetFeatureExtractor

from ..store.tensors import DTYPES


class CaptureTarget:
    """A frozen target that turns one prompt into its features; one forward at a time."""

    def __init__(self, extractor: TargetFeatureExtractor) -> None:
        self.extractor = extractor
        self.model = extractor.model
        self.layer_ids = tuple(extractor.layer_ids)
        self.hidden_size = int(self.model.config.get_text_config().hidden_size)
        # The HTTP servers run a thread per request; one forward at a time keeps memory bounded
        # and stops two requests from fighting over the same cores.
        self._lock = threading.Lock()

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the target's weights, which is the dtype of the features it returns."""
        return next(self.model.parameters()).dtype

    def features(self, input_ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(`hidden_states` [S, L*H] at the tapped layers in config order, final state [S, H])."""
        device = next(self.model.parameters()).device
        ids = torch.tensor([list(input_ids)], dtype=torch.long, device=device)
        with self._lock:
            hidden, last = self.extractor(ids, torch.ones_like(ids))
        return hidden[0].cpu(), last[0].cpu()


def load_capture_target(
    path: str | Path, layer_ids: Sequence[int], *, dtype: str, device: str = "cpu"
) -> CaptureTarget:
    """Load the target from a local HF folder (never the hub) in `dtype` on `device`."""
    if dtype not in DTYPES or dtype == "int64":
        raise ValueError(f"capture dtype {dtype!r} is not one of bfloat16, float16, float32")
    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(
            f"the target {folder} has no config.json (config field model.target must be a local "
            f"HF folder; weights are never downloaded at run time)"
        )
    extractor = TargetFeatureExtractor(folder, list(layer_ids), dtype=DTYPES[dtype], device=device)
    return CaptureTarget(extractor)
