"""`specdraft assets tiny-target --out DIR`: the tiny target at a fixed path a config can name.

The tiny target is built once into the cache under a name that hashes its recipe; configs (the
quickstart's) need a path that does not change, so this copies the cached folder there. It is
idempotent: a folder that already holds the same build is left alone, one that holds an older
build of the tiny target is replaced, and any other folder is refused.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import click

# Written into the copied folder: which cached build it is a copy of.
MARKER = "specdraft_tiny_target.json"


@click.group("assets")
def assets() -> None:
    """Build the local assets of tests and the quickstart (no model hub)."""


@assets.command("tiny-target")
@click.option(
    "--out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder to hold the tiny target (weights, tokenizer, generation config).",
)
@click.option(
    "--cache-dir",
    default=None,
    type=click.Path(file_okay=False, path_type=str),
    help="Cache to build in [default: $SPECDRAFT_CACHE or ~/.cache/specdraft].",
)
def tiny_target(out: Path, cache_dir: str | None) -> None:
    """Build (about a minute and a half, once) or find the cached tiny Qwen3 target with its
    tokenizer, and copy it into --out so that model.target can point at a fixed path."""
    from specdraft.trainer.assets import build_tiny_target

    built = build_tiny_target(cache_dir)
    click.echo(install_copy(built, out))


def install_copy(built: Path, out: Path) -> str:
    """Copy the cached build into `out` unless `out` already holds it; say what was done."""
    from specdraft.trainer.runtime.atomic import publish_dir

    marker = {"source": built.name}
    if out.exists():
        existing = out / MARKER
        if not existing.is_file():
            raise click.ClickException(
                f"--out {out} exists and is not a tiny-target copy (no {MARKER}); choose another "
                "folder or remove it"
            )
        if json.loads(existing.read_text(encoding="utf-8")) == marker:
            return f"{out}: up to date ({built.name})"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(built, tmp)
    (tmp / MARKER).write_text(json.dumps(marker), encoding="utf-8")
    if out.exists():
        shutil.rmtree(out)  # an older build of the tiny target, copied here before
    publish_dir(tmp, out)
    return f"{out}: tiny target {built.name}"
