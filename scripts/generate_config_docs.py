"""Regenerate docs/config.md and docs/config-schema.json from the config schema.

python scripts/generate_config_docs.py           # rewrite both files
python scripts/generate_config_docs.py --check   # exit 1 if either is out of date
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specdraft.config.reference import render_reference
from specdraft.config.schema_json import render_json_schema

DOCS = Path(__file__).resolve().parents[1] / "docs"
GENERATED = {"config.md": render_reference, "config-schema.json": render_json_schema}


def main() -> int:
    """Write (or with --check, compare) the generated config docs."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only report stale files")
    args = parser.parse_args()
    stale = []
    for name, render in GENERATED.items():
        path, text = DOCS / name, render()
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(name)
        if not args.check:
            path.write_text(text, encoding="utf-8")
            print(f"wrote {path}")
    if args.check and stale:
        print(f"out of date: {', '.join(stale)}; run python scripts/generate_config_docs.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
