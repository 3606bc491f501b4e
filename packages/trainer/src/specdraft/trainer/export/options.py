"""What a format writer is told besides the draft: the user's choices for this export."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ExportOptions:
    """The checkpoint exported and the options of `specdraft export` a format may need."""

    checkpoint: str
    # speculators' `speculators_config.verifier.name_or_path`: the target the draft serves with.
    verifier: str | None = None
