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

import importlib

from .base import StoreRules

# The registered stores, in the order docs and messages list them: one name per store, each a
# module here and a module `specdraft/trainer/disagg/store/<name>.py`.
STORE_NAMES = ("local", "mooncake")


def _load_rules(name: str) -> StoreRules:
    """`stores/<name>.py`'s RULES, checked to be the store of that name."""
    rules = getattr(importlib.import_module(f"{__name__}.{name}"), "RULES", None)
    if not isinstance(rules, StoreRules) or rules.name != name:
        raise TypeError(f"{__name__}.{name}.RULES must be the StoreRules named {name!r}")
    return rules


STORE_RULES: dict[str, StoreRules] = {name: _load_rules(name) for name in STORE_NAMES}


def settings_tables_ignored(store: str) -> list[str]:
    """The `[deployment.disaggregated.*]` settings tables of every store but `store`."""
    return [
        rules.settings_table
        for rules in STORE_RULES.values()
        if rules.settings_table is not None and rules.name != store
    ]


__all__ = ["STORE_NAMES", "STORE_RULES", "StoreRules", "settings_tables_ignored"]
