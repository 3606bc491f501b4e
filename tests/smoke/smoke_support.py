"""What the smoke tests share: the repository's paths and the import of every public module.

The smoke tests run in the suite (editable installs) and in tox.ini's envs, where each package is
installed from its wheel alone with the siblings it declares; there `import specdraft.<pkg>`
finds the installed copy, and an import that only works from the source tree, or only with an
undeclared dependency present, fails.
"""

from __future__ import annotations

import importlib
import pkgutil
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
# Lints clean with no optional extra installed (it selects no tracking backend).
QUICKSTART = EXAMPLES / "quickstart.toml"


def public_modules(package: str) -> list[str]:
    """`package` and every module and sub-package below it with no `_`-prefixed name part."""
    root = importlib.import_module(package)
    names = [package]
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


def assert_every_public_module_imports(package: str) -> None:
    """Import each public module of `package`; fail with every failing one and its traceback."""
    failures = []
    for name in public_modules(package):
        try:
            importlib.import_module(name)
        except Exception:
            failures.append(f"{name}:\n{traceback.format_exc(limit=-3)}")
    assert not failures, "\n".join(failures)


def broken_copy(example: Path, folder: Path, old: str, new: str) -> tuple[Path, int, int]:
    """`example` written to `folder` with its one `old` replaced by `new`: the path, and the line
    and column (1-based) where `new` starts."""
    text = example.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{old!r} is not in {example.name} exactly once"
    start = text.index(old)
    line = text.count("\n", 0, start) + 1
    col = start - (text.rfind("\n", 0, start) + 1) + 1
    path = folder / example.name
    path.write_text(text.replace(old, new), encoding="utf-8")
    return path, line, col
