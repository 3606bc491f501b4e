"""Check a tox env's install (tox.ini runs it after pip): `python check_install.py --torch
none|cpu DIST...`.

- The specdraft distributions installed are exactly DIST: pip pulled in the siblings each
  declares, and nothing else of ours.
- Each is installed from a wheel, not editable: its files under `specdraft/` are the files of its
  source tree (`packages/*/src`), byte for byte, no file missing or extra (a module or data
  file the wheel leaves out fails here), and `import specdraft.<name>` finds that copy.
- torch: `none`, not importable (the config package works without it); `cpu`, the CPU build.
Prints one line per check and exits 1 on the first failure.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def fail(message: str) -> None:
    print(f"check_install: FAIL: {message}")
    raise SystemExit(1)


def source_trees() -> dict[str, Path]:
    """Distribution name -> its folder in this checkout (packages/*/src/specdraft/*): the four
    packages of the `specdraft` namespace (the SGLang plugin is the sglang tests' business)."""
    trees = {}
    for pyproject in sorted(ROOT.glob("packages/*/pyproject.toml")):
        namespace = pyproject.parent / "src" / "specdraft"
        if namespace.is_dir():
            name = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["name"]
            [trees[name]] = namespace.iterdir()
    return trees


def shipped(folder: Path) -> dict[str, bytes]:
    """The files below `folder` (no byte-compiled ones), by path relative to its parent."""
    return {
        path.relative_to(folder.parent).as_posix(): path.read_bytes()
        for path in sorted(folder.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }


def check_distribution(name: str, tree: Path) -> None:
    dist = metadata.distribution(name)
    direct_url = dist.read_text("direct_url.json")
    if direct_url and json.loads(direct_url).get("dir_info", {}).get("editable"):
        fail(f"{name} is an editable install")
    installed = {
        str(file)[len("specdraft/") :]: file.locate().read_bytes()
        for file in dist.files or []
        if str(file).startswith(f"specdraft/{tree.name}/")
        and "__pycache__" not in file.parts
        and file.suffix != ".pyc"
    }
    source = shipped(tree)
    if installed.keys() != source.keys():
        missing = sorted(source.keys() - installed.keys())
        extra = sorted(installed.keys() - source.keys())
        fail(f"{name}: the wheel lacks {missing} and adds {extra} (against {tree})")
    differ = sorted(path for path in source if installed[path] != source[path])
    if differ:
        fail(f"{name}: installed files differ from the checkout: {differ}")
    origin = Path(importlib.util.find_spec(f"specdraft.{tree.name}").origin).resolve()
    home = Path(dist.locate_file("specdraft")).resolve()
    if not origin.is_relative_to(home):
        fail(f"import specdraft.{tree.name} finds {origin}, not the installed copy under {home}")
    where = tree.relative_to(ROOT)
    print(f"check_install: {name} {dist.version}: {len(source)} files as in {where}")


def check_torch(expected: str) -> None:
    if expected == "none":
        if importlib.util.find_spec("torch") is not None:
            fail("torch is installed in an env that must not have it")
        print("check_install: no torch")
        return
    if importlib.util.find_spec("torch") is None:
        fail("torch is not installed")
    import torch

    if not torch.__version__.endswith("+cpu") or torch.version.cuda is not None:
        fail(f"torch {torch.__version__} is not the CPU build")
    print(f"check_install: torch {torch.__version__}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--torch", choices=("none", "cpu"), required=True)
    parser.add_argument("distributions", nargs="+")
    args = parser.parse_args()
    trees = source_trees()
    ours = {d.metadata["Name"] for d in metadata.distributions() if d.metadata["Name"] in trees}
    if ours != set(args.distributions):
        fail(f"specdraft distributions installed: {sorted(ours)}, expected {args.distributions}")
    for name in args.distributions:
        check_distribution(name, trees[name])
    check_torch(args.torch)


if __name__ == "__main__":
    sys.exit(main())
