"""DSpark: shifted labels, a Markov head on the logits and a confidence head.

The trainer's half of the family: `model.py`, `hf_config.py` and `family.py` (its `FAMILY`,
which `models.family` loads by this folder's name). Its options table, option rules and lint
checks are the config package's `specdraft/config/families/dspark.py` (no torch there).
"""

from .model import Qwen3DSparkModel

__all__ = ["Qwen3DSparkModel"]
