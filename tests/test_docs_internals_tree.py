"""docs/internals.md's tree of the packages matches the filesystem, so it cannot drift.

The tree is the fenced block after the `<!-- package tree -->` marker. Each line is one entry:
a package root (`packages/<dist>/src/specdraft/<pkg>/`, unindented) or, indented two spaces per
level below its parent, a folder (`name/`) or a module (`name.py`), then at least two spaces and
one line of purpose. `__init__.py` files are not listed: a folder's line says what its package is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "internals.md"
MARKER = "<!-- package tree -->"
ENTRY = re.compile(r"^(?P<indent> *)(?P<name>\S+)(?: {2,}(?P<purpose>\S.*))?$")


@dataclass(frozen=True)
class Entry:
    """One line of the tree: the path it names, its line in the doc and its purpose."""

    path: str
    line: int
    purpose: str


def parse_tree(text: str) -> list[Entry]:
    """The entries of the tree block after MARKER; raises ValueError naming a malformed line."""
    lines = text.splitlines()
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == MARKER)
    except StopIteration:
        raise ValueError(f"no {MARKER!r} line before the package tree") from None
    if start + 1 >= len(lines) or not lines[start + 1].startswith("```"):
        raise ValueError(f"line {start + 2}: the tree's ``` fence must follow {MARKER!r}")
    entries: list[Entry] = []
    stack: list[str] = []  # the folder path at each depth
    for number, line in enumerate(lines[start + 2 :], start=start + 3):
        if line.startswith("```"):
            return entries
        match = ENTRY.match(line)
        if not match or not match["purpose"]:
            raise ValueError(f"line {number}: {line!r} is not `name  purpose` (two spaces apart)")
        indent, name = len(match["indent"]), match["name"]
        if indent % 2 or indent // 2 > len(stack):
            raise ValueError(f"line {number}: {name} is indented {indent}; its parent is above")
        depth = indent // 2
        if depth == 0 and not re.fullmatch(r"packages/[\w-]+/src/specdraft/\w+/", name):
            raise ValueError(
                f"line {number}: {name}: roots are packages/<dist>/src/specdraft/<pkg>/"
            )
        if depth and not re.fullmatch(r"\w+/|\w+\.py", name):
            raise ValueError(f"line {number}: {name}: an entry is a folder `x/` or a module `x.py`")
        del stack[depth:]
        path = "".join(stack) + name
        entries.append(Entry(path.rstrip("/"), number, match["purpose"]))
        if name.endswith("/"):
            stack.append(name)
    raise ValueError("the package tree's ``` fence is never closed")


def package_paths(root: Path) -> set[str]:
    """Every package folder and module under packages/*/src/specdraft (not __init__.py)."""
    found: set[str] = set()
    for source in root.glob("packages/*/src/specdraft"):
        for path in source.rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            relative = path.relative_to(root)
            if path.name != "__init__.py":
                found.add(relative.as_posix())
            # Every folder between the namespace and the module is a package of its own.
            for folder in relative.parents:
                if len(folder.parts) > 4:  # below packages/<dist>/src/specdraft
                    found.add(folder.as_posix())
    return found


def drift(entries: list[Entry], actual: set[str]) -> list[str]:
    """What is wrong between the tree and the filesystem, one line per problem."""
    listed: dict[str, Entry] = {}
    problems = []
    for entry in entries:
        if entry.path in listed:
            problems.append(f"docs/internals.md:{entry.line}: {entry.path} is listed twice")
        listed[entry.path] = entry
    for path in sorted(set(listed) - actual):
        entry = listed[path]
        problems.append(f"docs/internals.md:{entry.line}: {path} is listed but does not exist")
    for path in sorted(actual - set(listed)):
        problems.append(f"{path} exists but docs/internals.md's tree does not list it")
    return problems


def test_the_tree_lists_every_package_folder_and_module_and_nothing_else():
    """Add a line (name, two spaces, its purpose) for a new module; drop it for a removed one."""
    entries = parse_tree(DOC.read_text(encoding="utf-8"))
    problems = drift(entries, package_paths(ROOT))
    assert not problems, "docs/internals.md's package tree has drifted:\n" + "\n".join(problems)


def test_drift_names_a_missing_and_an_unlisted_path(tmp_path):
    """The check itself: a stale line and a new module are both reported, with the line."""
    package = tmp_path / "packages" / "demo" / "src" / "specdraft" / "demo"
    (package / "inner").mkdir(parents=True)
    for name in ("__init__.py", "kept.py", "new.py", "inner/__init__.py", "inner/deep.py"):
        (package / name).write_text("")
    doc = "\n".join(
        [
            "intro",
            MARKER,
            "```",
            "packages/demo/src/specdraft/demo/  the demo package",
            "  kept.py                           a module that is there",
            "  gone.py                           a module that was removed",
            "  inner/                            a sub-package",
            "    deep.py                         its module",
            "```",
        ]
    )
    entries = parse_tree(doc)
    assert [entry.path for entry in entries][-1] == "packages/demo/src/specdraft/demo/inner/deep.py"
    prefix = "packages/demo/src/specdraft/demo"
    assert drift(entries, package_paths(tmp_path)) == [
        f"docs/internals.md:6: {prefix}/gone.py is listed but does not exist",
        f"{prefix}/new.py exists but docs/internals.md's tree does not list it",
    ]


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("  kept.py", "is not `name  purpose`"),
        ("      kept.py  too deep", "its parent is above"),
        ("  kept  no suffix", "a folder `x/` or a module `x.py`"),
    ],
)
def test_a_malformed_tree_line_is_named(line, problem):
    """A line without a purpose, indented under nothing, or not a folder/module fails by number."""
    doc = "\n".join([MARKER, "```", "packages/demo/src/specdraft/demo/  the demo", line, "```"])
    with pytest.raises(ValueError, match=rf"line 4: .*{re.escape(problem)}"):
        parse_tree(doc)
