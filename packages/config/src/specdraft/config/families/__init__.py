"""The draft families, config side (torch-free): the registry the schema and the linter read.

Each family is a module here (`dflash.py`, `dflash2.py`, `dspark.py`) with one `FamilyRules`:
its options table, the hard rules on it, its lint checks against the target. `FAMILY_NAMES`
below is the one registration line (a name per family). Nothing else in the config package names a
family: `ModelConfig.algorithm`'s allowed values come from this registry, its `[model.<family>]`
tables are `FamilyTables` below (mounted by schema.py), the linter reports the tables of the
families not chosen as ignored (SD319) and runs the chosen family's target checks.

The trainer finds each family's torch half by the same name, `specdraft.trainer.models.<name>`,
so a new family is this module + the trainer's folder + the line below (and, with options, its
line in `FamilyTables`). The two halves cannot
be one folder: the config package never imports torch nor the trainer, and a config-only
install still validates every family's options.
"""

from __future__ import annotations

from ..registry import load_registered
from ..section import Section, check_tables
from .base import FamilyRules
from .dflash2 import DFlash2Options
from .dspark import DSparkOptions

# The registered families, in the order docs and messages list them: one name per family, each
# a module here and a folder `specdraft/trainer/models/<name>/`.
FAMILY_NAMES = ("dflash", "dflash2", "dspark")


FAMILY_RULES: dict[str, FamilyRules] = load_registered(__name__, FAMILY_NAMES, FamilyRules)


class FamilyTables(Section):
    """The `[model.<family>]` options tables, one per registered family that has options.

    Declared name by name, not built from the registry, so that type checkers see
    `cfg.model.dflash2`; `check_tables` below keeps it equal to the registry.
    """

    dflash2: DFlash2Options = FAMILY_RULES["dflash2"].table()
    dspark: DSparkOptions = FAMILY_RULES["dspark"].table()


check_tables(FamilyTables, {rules.name: rules.options for rules in FAMILY_RULES.values()})


def family_rules(algorithm: str) -> FamilyRules:
    """The rules of a `model.algorithm` value (the schema admits only registered ones)."""
    return FAMILY_RULES[algorithm]


def options_tables_ignored(algorithm: str) -> list[str]:
    """The `[model.*]` options tables of every family but `algorithm` (ignored if written)."""
    return [
        rules.options_table
        for rules in FAMILY_RULES.values()
        if rules.options_table is not None and rules.name != algorithm
    ]


def family_rule_types() -> tuple[str, ...]:
    """The error types of every family's hard rules (each has a code in codes.py)."""
    return tuple(t for rules in FAMILY_RULES.values() for t in rules.rule_types)


__all__ = [
    "FAMILY_NAMES",
    "FAMILY_RULES",
    "FamilyRules",
    "FamilyTables",
    "family_rule_types",
    "family_rules",
    "options_tables_ignored",
]
