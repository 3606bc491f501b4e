"""`specdraft prepare-features CONFIG`: target features of the training corpus, written once."""

from __future__ import annotations

from pathlib import Path

import click

from .common import config_argument, load_or_exit, overrides_option


@click.command("prepare-features")
@config_argument
@click.option(
    "--out",
    default=None,
    type=click.Path(file_okay=False, path_type=str),
    help="Feature folder to write (or finish) [default: <output_dir>/features].",
)
@click.option(
    "--shard-size",
    type=click.IntRange(min=1),
    default=256,
    show_default=True,
    help="Samples per safetensors shard (the unit of resumption).",
)
@click.option(
    "--batch-size",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="Samples per target forward.",
)
@overrides_option
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def prepare_features(
    config_path: str,
    out: str | None,
    shard_size: int,
    batch_size: int,
    overrides: tuple[str, ...],
    no_progress: bool,
) -> None:
    """Run model.target once over CONFIG's training conversations and write feature shards.

    \b
    The folder holds safetensors shards and an index that records the target, layer ids,
    tokenizer, chat template, max_length and data; an interrupted run resumes at the first
    unfinished shard. Train from it with:
      data.format = "features"
      data.train_paths = ["<the folder>"]
    Training refuses shards that do not match its config and names the field.
    """
    config = load_or_exit(config_path, overrides)
    if config.data.format != "sharegpt":
        raise click.ClickException(
            f"{config_path}: data.format = {config.data.format!r}; prepare-features reads the "
            "conversations of a 'sharegpt' config (--set data.format='\"sharegpt\"' and "
            "data.train_paths to conversation files)"
        )
    from specdraft.trainer.features.prepare import prepare_features as run

    folder = Path(out) if out else Path(config.output_dir) / "features"
    try:
        result = run(
            config, folder, shard_size=shard_size, batch_size=batch_size, progress=not no_progress
        )
    except (ValueError, FileNotFoundError) as exc:
        raise click.ClickException(f"{config_path}: {exc}") from None
    click.echo(
        f"{result.folder}: {result.num_samples} samples, {result.shards_written} shard(s) "
        f"written, {result.shards_skipped} already there"
    )
    click.echo(
        f"train from it with --set data.format='\"features\"' "
        f"--set 'data.train_paths=[\"{result.folder}\"]'"
    )
