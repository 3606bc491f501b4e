"""The feature stores, config side (torch-free): the registry the schema and the linter read.

Each store is a module here (`local.py`, `mooncake.py`) with one `StoreRules`: its summary and,
if it has any, its settings table. `STORE_NAMES` below is the one registration line (a name per
store). Nothing else in the config package names a store: `deployment.disaggregated.store`'s
allowed values and its `[deployment.disaggregated.<store>]` tables are built from this registry
(schema.py), and the linter reports the tables of the stores not chosen as ignored (SD403).

The trainer finds each store's implementation by the same name,
`specdraft.trainer.disagg.store.<name>` (its `KIND`), so a new store is this module + the
trainer's module + the line below.
"""

from __future__ import annotations

from ..registry import load_registered
from .base import StoreRules

# The registered stores, in the order docs and messages list them: one name per store, each a
# module here and a module `specdraft/trainer/disagg/store/<name>.py`.
STORE_NAMES = ("local", "mooncake")


STORE_RULES: dict[str, StoreRules] = load_registered(__name__, STORE_NAMES, StoreRules)


def settings_tables_ignored(store: str) -> list[str]:
    """The `[deployment.disaggregated.*]` settings tables of every store but `store`."""
    return [
        rules.settings_table
        for rules in STORE_RULES.values()
        if rules.settings_table is not None and rules.name != store
    ]


__all__ = ["STORE_NAMES", "STORE_RULES", "StoreRules", "settings_tables_ignored"]
