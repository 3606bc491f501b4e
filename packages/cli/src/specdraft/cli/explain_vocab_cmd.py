"""`specdraft explain-vocab`: the draft vocabulary's coverage per size on the real corpus."""

from __future__ import annotations

import json

import click

from .common import (
    CONFIG_ERROR_EXIT,
    config_argument,
    format_option,
    load_or_exit,
    overrides_option,
)


def _fail(message: str) -> None:
    click.echo(message, err=True)
    raise SystemExit(CONFIG_ERROR_EXIT)


def _sizes(value: str | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    try:
        sizes = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of sizes") from None
    if not sizes or min(sizes) < 1:
        raise click.BadParameter("sizes must be positive integers, e.g. 8192,16384")
    return sizes


@click.command("explain-vocab")
@config_argument
@click.option(
    "--sizes",
    metavar="N,N,...",
    help="Draft vocabulary sizes to show besides the configured one and the suggestions "
    "(default 8192,16384,32768).",
)
@format_option("text", "json", help="Text for people, JSON for machines.")
@overrides_option
def explain_vocab(
    config_path: str, sizes: str | None, fmt: str, overrides: tuple[str, ...]
) -> None:
    """Dry run: what a draft vocabulary (model.draft_vocab_size) of each size covers.

    Tokenises the training corpus (or reads its feature shards) and the held-out corpus
    (data.eval_paths) as training would, counts the supervised labels, and prints for each
    size the share of labels the draft vocabulary holds on both, with the smallest sizes that
    cover 95/98/99% of held-out labels. No model is built and the target is never run.
    """
    try:
        shown = _sizes(sizes)
    except click.BadParameter as err:
        _fail(f"explain-vocab: --sizes: {err.message}")
    config = load_or_exit(config_path, overrides)

    from specdraft.trainer.models import load_target_config
    from specdraft.trainer.models.config import target_text_config
    from specdraft.trainer.vocab import corpus_token_counts
    from specdraft.trainer.vocab.explain import DEFAULT_SIZES, render_vocab_text, vocab_report

    try:
        text = target_text_config(load_target_config(config.model.target))
        vocab, hidden = int(text.vocab_size), int(text.hidden_size)
        train = corpus_token_counts(config, vocab, split="train", progress=True)
        held_out = corpus_token_counts(config, vocab, split="eval", progress=True)
    except (OSError, ValueError) as err:
        _fail(f"explain-vocab: {config_path}: cannot load the target or the corpus: {err}")
    assert train is not None
    if train.sum() == 0:
        _fail(f"explain-vocab: {config_path}: the training corpus has no supervised labels")
    report = vocab_report(
        train,
        held_out,
        configured=config.model.draft_vocab_size,
        sizes=shown or DEFAULT_SIZES,
        hidden_size=hidden,
    )
    if fmt == "json":
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(render_vocab_text(report, config_path), nl=False)
