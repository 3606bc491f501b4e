"""DFlash2: the backbone with in-block convolutions and a pairwise path selector."""

from .model import DFlash2DraftModel

__all__ = ["DFlash2DraftModel"]
