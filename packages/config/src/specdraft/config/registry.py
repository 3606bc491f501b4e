"""Registries of named plug-ins: families, feature stores, tracking and training backends.

Every kind registers one way. Its names are a tuple on the torch-free config side (the schema's
allowed values, the order docs list them), and each name is a module found by that name (the
config side's `families/<name>.py`, the trainer's `models/<name>/family.py`, ...) holding one
object of the kind whose `name` is that name. So a name is checked where it is loaded, and the
trainer never keeps a second list of names in step with the config package's.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

Entry = TypeVar("Entry")

# What to raise when a registered name has no module: (name, module) -> the error.
Missing = Callable[[str, str], Exception]


def load_one(
    package: str,
    name: str,
    kind: type[Entry],
    *,
    attr: str = "RULES",
    module: str = "{name}",
    missing: Missing | None = None,
) -> Entry:
    """`<package>.<module>.<attr>` for one name, checked to be a `kind` carrying that name.

    `module` is the name's module under `package` (`{name}` is replaced by it); `missing`, when
    given, builds the error for a name whose module (or folder) does not exist, so that the
    message says what a new entry lacks. A module that exists but fails to import raises as is.
    """
    module_name = f"{package}.{module.format(name=name)}"
    try:
        found = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        # The name's own module or a folder on its way is missing, not a dependency inside it.
        own = exc.name is not None and exc.name.startswith(f"{package}.")
        if missing is None or not own or not f"{module_name}.".startswith(f"{exc.name}."):
            raise
        raise missing(name, module_name) from None
    entry = getattr(found, attr, None)
    if not isinstance(entry, kind) or getattr(entry, "name", None) != name:
        raise TypeError(f"{module_name}.{attr} must be the {kind.__name__} named {name!r}")
    return entry


def load_registered(
    package: str,
    names: Iterable[str],
    kind: type[Entry],
    *,
    attr: str = "RULES",
    module: str = "{name}",
    missing: Missing | None = None,
) -> dict[str, Entry]:
    """`load_one` for each name, in the registry's order."""
    return {
        name: load_one(package, name, kind, attr=attr, module=module, missing=missing)
        for name in names
    }


def listed(summaries: Mapping[str, str], *, last: str = " or ") -> str:
    """A registry's names as its field's help lists them: `'a' (summary), 'b' or 'c'`.

    A name whose summary is empty stands alone; `last` joins the last two.
    """
    clauses = [f"'{name}' ({text})" if text else f"'{name}'" for name, text in summaries.items()]
    return last.join([", ".join(clauses[:-1]), clauses[-1]]) if len(clauses) > 1 else clauses[0]
