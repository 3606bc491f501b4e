"""DFlash2: the backbone with in-block convolutions and a pairwise path selector.

The trainer's half of the family: `model.py`, `hf_config.py` and `family.py` (its `FAMILY`,
which `models.family` loads by this folder's name). Its options table, option rules and lint
checks are the config package's `specdraft/config/families/dflash2.py` (no torch there).
"""

from .model import DFlash2DraftModel

__all__ = ["DFlash2DraftModel"]
