"""The embedded feature store: files under the run folder (one machine); no settings."""

from .base import StoreRules

RULES = StoreRules("local", "files under the run folder, one machine")
