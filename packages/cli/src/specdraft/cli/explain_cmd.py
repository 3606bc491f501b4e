"""`specdraft explain-buckets`: the dry run of the pad policy on the corpus (no model is built)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

# Exit status of a config, lengths file or option that cannot be used (the lint convention).
EXIT_FATAL = 2


def _fail(message: str) -> None:
    click.echo(message, err=True)
    raise SystemExit(EXIT_FATAL)


def _config_error_text(err: Exception, overrides: tuple[str, ...]) -> str:
    try:
        from specdraft.config.report import format_config_error
    except ImportError:  # an older config package without the linter's positions
        return str(err)
    return format_config_error(err, overrides)  # type: ignore[arg-type]


def _corpus_source(config: Any) -> Any:
    """Tokenise the corpus as training would (with a progress bar): lengths and anchor counts."""
    import torch

    from specdraft.collate import anchor_counts
    from specdraft.collate.length_source import LengthSource
    from specdraft.trainer.data import build_dataset, sample_lengths

    dataset, report = build_dataset(config, split="train", progress=True)
    # The same loss masks training collates, counted the way the collator counts them.
    counts = [
        anchor_counts(torch.as_tensor(row["loss_mask"], dtype=torch.long)[None])[0]
        for row in dataset
    ]
    return LengthSource(
        "corpus",
        report.source,
        list(sample_lengths(dataset)),
        skipped=dict(report.skipped),
        dropped_incomplete=report.dropped_incomplete,
        anchor_counts=counts,
    )


@click.command("explain-buckets")
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False))
@click.option(
    "--suggest",
    "suggest_k",
    type=click.IntRange(min=1),
    metavar="K",
    help="Also print the K optimal buckets (multiples of 128, the last = max_length).",
)
@click.option(
    "--suggest-anchors",
    "suggest_anchors_k",
    type=click.IntRange(min=1),
    metavar="K",
    help="Also print the K optimal anchor buckets (exact; the last = num_anchors). Needs the "
    "corpus (its loss masks).",
)
@click.option(
    "--format",
    "output_format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="Text for people, JSON for machines.",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(dir_okay=False),
    metavar="FILE.png",
    help="Also draw the length histogram with the bucket edges into a PNG, and, for a static "
    "run read from the corpus, the length x anchor-width grid (micro-batches and anchor "
    "occupancy per cell) into FILE-grid.png; with training.packing, the packed rows' fill "
    "into FILE-rows.png.",
)
@click.option(
    "--lengths",
    "lengths_path",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="Read sample lengths (one per line) instead of tokenising the corpus.",
)
@click.option(
    "--longest",
    type=click.IntRange(min=1),
    metavar="N",
    help="Explain one micro-batch whose longest sample has N tokens.",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="KEY=VALUE",
    help="Override a config value, e.g. --set training.micro_batch_size=4 (repeatable).",
)
def explain_buckets(
    config_path: str,
    suggest_k: int | None,
    suggest_anchors_k: int | None,
    output_format: str,
    plot_path: str | None,
    lengths_path: str | None,
    longest: int | None,
    overrides: tuple[str, ...],
) -> None:
    """Dry run: the pad lengths a config resolves to and what they cost on the corpus.

    Prints the pad policy, the micro-batches per bucket, pad-to-longest / static_shapes / the
    configured buckets (and, with training.packing, packed rows) side by side (computed
    positions per real token), with sliding-window draft layers the attention keys the windows
    skip per bucket, the compile plan, and warnings about unused, rare or suboptimal buckets.
    The corpus is tokenised as training would; --lengths FILE or --longest N skip it. No model
    is built.
    """
    from specdraft.config import ConfigError, ShapePolicy, load_config

    if lengths_path and longest:
        _fail("explain-buckets: use either --lengths FILE or --longest N, not both")
    if longest and (suggest_k or plot_path):
        _fail("explain-buckets: --suggest and --plot need sample lengths (a corpus or --lengths)")
    if suggest_anchors_k and (longest or lengths_path):
        _fail(
            "explain-buckets: --suggest-anchors needs the loss masks of the corpus; drop "
            "--lengths / --longest so the corpus is tokenised"
        )
    try:
        config = load_config(config_path, overrides)
    except ConfigError as err:
        _fail(_config_error_text(err, overrides))

    # torch comes in with the collate package: only after the config is known to be good.
    from specdraft.collate.explain import build_report
    from specdraft.collate.explain_text import render_json, render_text
    from specdraft.collate.histogram import save_plot
    from specdraft.collate.length_source import LengthSource, read_lengths_file

    max_length = config.data.max_length
    if longest:
        if longest > max_length:
            _fail(
                f"explain-buckets: --longest {longest} is above data.max_length = {max_length}; "
                f"samples are truncated to max_length, so no micro-batch is longer"
            )
        source = LengthSource("longest", f"--longest {longest}", [longest])
    elif lengths_path:
        try:
            source = read_lengths_file(lengths_path, max_length)
        except ValueError as err:
            _fail(f"explain-buckets: {err}")
    else:
        try:
            source = _corpus_source(config)
        except (OSError, ValueError) as err:
            # A missing tokenizer or data file, or a bad row under bad_rows = "fail".
            _fail(f"explain-buckets: {config_path}: cannot load the corpus: {err}")
        if not source.lengths:
            _fail(f"explain-buckets: {source.description}: no usable samples")

    try:
        # The one shape policy of this (dry) run: the report and the compile plan read it.
        shapes = ShapePolicy.from_config(config)
        report = build_report(
            config,
            source,
            shapes=shapes,
            config_path=config_path,
            suggest_k=suggest_k,
            suggest_anchors_k=suggest_anchors_k,
        )
    except ValueError as err:
        _fail(f"explain-buckets: {config_path}: {err}")
    click.echo(render_json(report) if output_format == "json" else render_text(report), nl=False)
    if output_format == "json":
        click.echo()
    if plot_path:
        try:
            save_plot(report, plot_path)
        except (OSError, RuntimeError) as err:
            _fail(f"explain-buckets: cannot write the plot {plot_path}: {err}")
        click.echo(f"plot written to {plot_path}", err=True)
        anchors = report.get("anchors")
        if anchors and anchors.get("cells"):
            from specdraft.collate.anchor_accounting import save_grid_plot

            grid_path = grid_plot_path(plot_path)
            try:
                save_grid_plot(report, grid_path)
            except (OSError, RuntimeError) as err:
                _fail(f"explain-buckets: cannot write the grid plot {grid_path}: {err}")
            click.echo(f"shape grid plot written to {grid_path}", err=True)
        if report.get("packing"):
            from specdraft.collate.packing_accounting import save_row_fill_plot

            rows_path = rows_plot_path(plot_path)
            try:
                save_row_fill_plot(report, rows_path)
            except (OSError, RuntimeError) as err:
                _fail(f"explain-buckets: cannot write the row-fill plot {rows_path}: {err}")
            click.echo(f"row fill plot written to {rows_path}", err=True)


def rows_plot_path(plot_path: str) -> Path:
    """Where --plot FILE.png puts the packed rows' fill histogram: FILE-rows.png."""
    path = Path(plot_path)
    return path.with_name(f"{path.stem}-rows{path.suffix or '.png'}")


def grid_plot_path(plot_path: str) -> Path:
    """Where --plot FILE.png puts the shape grid: FILE-grid.png next to the histogram."""
    path = Path(plot_path)
    return path.with_name(f"{path.stem}-grid{path.suffix or '.png'}")
