"""Plain DFlash: the shared backbone alone (slot k predicts anchor + k).

The trainer's half of the family: `model.py`, `hf_config.py` and `family.py` (its `FAMILY`,
which `models.family` loads by this folder's name). Its options table, option rules and lint
checks are the config package's `specdraft/config/families/dflash.py` (no torch there).
"""

from .model import DFlashDraftModel

__all__ = ["DFlashDraftModel"]
