"""What the config package knows of one feature store (torch-free): `StoreRules`.

A store's torch-free half is `specdraft/config/stores/<name>.py`: its one-line summary and, if it
has settings, their table (a pydantic model the schema mounts at
`[deployment.disaggregated.<name>]`, so `specdraft lint` validates them without the trainer).
The half that moves bytes is the trainer's module `specdraft/trainer/disagg/store/<name>.py`
(its `StoreKind`: how to open it, the services a managed run starts for it), found by the name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..section import Section, table


@dataclass(frozen=True)
class StoreRules:
    """One feature store as the schema and the linter see it."""

    # The `deployment.disaggregated.store` value, also the trainer's module `store/<name>.py`.
    name: str
    # Its clause in `store`'s help: "files under the run folder, one machine".
    summary: str
    # Its settings as a `[deployment.disaggregated.<name>]` table, or None (the local store).
    settings: type[Section] | None = None

    @property
    def settings_table(self) -> str | None:
        """The `[deployment.disaggregated.*]` table of this store's settings, or None."""
        return self.name if self.settings is not None else None

    def table(self) -> Any:
        """The `[deployment.disaggregated.<name>]` field of its settings (`stores.StoreTables`)."""
        if self.settings is None:
            raise TypeError(f"store {self.name!r} has no settings table")
        title = self.settings.__name__.removesuffix("Config")
        return table(self.settings, f"{title} settings (used when store = '{self.name}').")

    def settings_of(self, disaggregated: Any) -> Any:
        """This store's settings object of a `DisaggregatedConfig` (None without settings)."""
        return getattr(disaggregated, self.name) if self.settings is not None else None
