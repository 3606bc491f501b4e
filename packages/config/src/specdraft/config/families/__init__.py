"""The draft families as the linter sees them (torch-free): options table and target checks.

One `FamilyRules` per `model.algorithm` value. The linter iterates over `FAMILY_RULES` instead of
naming families: the options tables of the families not chosen are reported as ignored (SD319),
and the chosen family's own checks against the target run with the other target checks. The
trainer's registry (`specdraft.trainer.models.family.FAMILIES`) binds the same names to model
classes; a test keeps the two registries and the schema's `model.algorithm` values equal.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .finding import Problem
from .schema import Config
from .target_info import TargetInfo


@dataclass(frozen=True)
class FamilyRules:
    """What the linter knows of one draft family."""

    name: str
    # The `[model.<table>]` holding this family's options, or None (plain DFlash has none).
    options_table: str | None
    # Soft findings about this family's options against the target's facts.
    target_checks: Callable[[Config, TargetInfo], list[Problem]]


def _no_target_checks(config: Config, info: TargetInfo) -> list[Problem]:
    return []


def _conv_group_divides_hidden(config: Config, info: TargetInfo) -> list[Problem]:
    """DFlash2's conv groups split the hidden size: a group size must divide it."""
    group, hidden = config.model.dflash2.conv_group_size, info.hidden_size or 0
    if hidden <= 0 or hidden % group == 0:
        return []
    return [
        Problem(
            "SD317",
            ("model", "dflash2", "conv_group_size"),
            f"model.dflash2.conv_group_size {group} does not divide the hidden size "
            f"{hidden} of the target ({info.folder}); try {_divisor_below(hidden, group)}",
        )
    ]


def _divisor_below(total: int, limit: int) -> int:
    """The largest divisor of `total` that is at most `limit` (a suggested group size)."""
    return next(d for d in range(min(limit, total), 0, -1) if total % d == 0)


FAMILY_RULES: dict[str, FamilyRules] = {
    rules.name: rules
    for rules in (
        FamilyRules("dflash", None, _no_target_checks),
        FamilyRules("dflash2", "dflash2", _conv_group_divides_hidden),
        FamilyRules("dspark", "dspark", _no_target_checks),
    )
}


def family_rules(algorithm: str) -> FamilyRules:
    """The linter's rules of a `model.algorithm` value (the schema admits only known ones)."""
    return FAMILY_RULES[algorithm]


def options_tables_ignored(algorithm: str) -> list[str]:
    """The `[model.*]` options tables of every family but `algorithm` (ignored if written)."""
    return [
        rules.options_table
        for rules in FAMILY_RULES.values()
        if rules.options_table is not None and rules.name != algorithm
    ]
