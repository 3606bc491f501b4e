"""Registries of named modules (families, feature stores): each name is a module with its RULES."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from typing import TypeVar

Rules = TypeVar("Rules")


def load_registered(package: str, names: Iterable[str], kind: type[Rules]) -> dict[str, Rules]:
    """`<package>.<name>.RULES` for each name, checked to be a `kind` carrying that name."""
    found: dict[str, Rules] = {}
    for name in names:
        rules = getattr(importlib.import_module(f"{package}.{name}"), "RULES", None)
        if not isinstance(rules, kind) or getattr(rules, "name", None) != name:
            raise TypeError(f"{package}.{name}.RULES must be the {kind.__name__} named {name!r}")
        found[name] = rules
    return found
