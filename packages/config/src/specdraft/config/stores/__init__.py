"""The feature stores, config side (torch-free): the registry the schema and the linter read.

Each store is a module here (`local.py`, `mooncake.py`) with one `StoreRules`: its summary and,
if it has any, its settings table. `STORE_NAMES` below is the one registration line (a name per
store). Nothing else in the config package names a store: `deployment.disaggregated.store`'s
allowed values come from this registry, its `[deployment.disaggregated.<store>]` tables are
`StoreTables` below (mounted by schema.py), and the linter reports the tables of the stores not
chosen as ignored (SD403).

The trainer finds each store's implementation by the same name,
`specdraft.trainer.disagg.store.<name>` (its `KIND`), so a new store is this module + the
trainer's module + the line below (and, with settings, its line in `StoreTables`).
"""

from __future__ import annotations

from ..registry import load_registered
from ..section import Section, check_tables
from .base import StoreRules
from .mooncake import MooncakeConfig

# The registered stores, in the order docs and messages list them: one name per store, each a
# module here and a module `specdraft/trainer/disagg/store/<name>.py`.
STORE_NAMES = ("local", "mooncake")


STORE_RULES: dict[str, StoreRules] = load_registered(__name__, STORE_NAMES, StoreRules)


class StoreTables(Section):
    """The `[deployment.disaggregated.<store>]` settings tables, one per store with settings.

    Declared name by name so that type checkers see `dis.mooncake`; `check_tables` below keeps
    it equal to the registry.
    """

    mooncake: MooncakeConfig = STORE_RULES["mooncake"].table()


check_tables(StoreTables, {rules.name: rules.settings for rules in STORE_RULES.values()})


def settings_tables_ignored(store: str) -> list[str]:
    """The `[deployment.disaggregated.*]` settings tables of every store but `store`."""
    return [
        rules.settings_table
        for rules in STORE_RULES.values()
        if rules.settings_table is not None and rules.name != store
    ]


__all__ = ["STORE_NAMES", "STORE_RULES", "StoreRules", "StoreTables", "settings_tables_ignored"]
