"""DSpark: shifted labels, a Markov head on the logits and a confidence head."""

from .model import Qwen3DSparkModel

__all__ = ["Qwen3DSparkModel"]
