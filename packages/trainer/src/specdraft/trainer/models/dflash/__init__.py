"""Plain DFlash: the shared backbone alone (slot k predicts anchor + k)."""

from .model import DFlashDraftModel

__all__ = ["DFlashDraftModel"]
