"""`specdraft explain-layers`: rank the target's layers by probes and suggest target_layer_ids."""

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


def _offsets(value: str) -> tuple[int, ...]:
    try:
        offsets = tuple(int(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of offsets") from None
    if not offsets:
        raise click.BadParameter("give at least one offset, e.g. 2,3,4")
    return offsets


@click.command("explain-layers")
@config_argument
@click.option(
    "--samples",
    type=int,
    default=64,
    show_default=True,
    help="Training conversations the probes are fitted on.",
)
@click.option(
    "--eval-samples",
    type=int,
    default=32,
    show_default=True,
    help="Held-out conversations they are scored on (data.eval_paths; without it, training "
    "conversations not fitted on).",
)
@click.option(
    "--positions",
    type=int,
    default=64,
    show_default=True,
    help="Positions drawn per conversation.",
)
@click.option(
    "--offsets",
    default="2,3,4",
    show_default=True,
    metavar="D,D,...",
    help="Tokens x(j+d) probed from the features at j: +2 is the first drafted token (slot 1).",
)
@click.option(
    "--vocab",
    type=int,
    default=4096,
    show_default=True,
    help="The probes' head: this many most frequent supervised labels (others count as misses).",
)
@click.option(
    "--count",
    type=int,
    default=None,
    help="Taps to suggest (default: as many as model.target_layer_ids holds).",
)
@click.option("--seed", type=int, default=None, help="Sampling seed (default: training.seed).")
@format_option("text", "json", help="Text for people, JSON for machines.")
@overrides_option
def explain_layers(
    config_path: str,
    samples: int,
    eval_samples: int,
    positions: int,
    offsets: str,
    vocab: int,
    count: int | None,
    seed: int | None,
    fmt: str,
    overrides: tuple[str, ...],
) -> None:
    """Dry run: rank the target's layers by probes and suggest model.target_layer_ids.

    Reads a few training conversations as training does (chat template, loss mask,
    data.max_length), runs the target in-process to get every layer's hidden states, and
    scores each layer by how well its state at position j predicts the tokens a draft anchored
    at j+1 must produce (x(j+2), x(j+3), ...), with a closed-form ridge probe read by the
    target's frozen head, scored on held-out conversations; also the early-exit loss. Suggests
    the configured number of taps by greedy forward selection (never the last layer) and prints
    the line to paste. Nothing is trained or written.
    """
    try:
        parsed = _offsets(offsets)
    except click.BadParameter as err:
        _fail(f"explain-layers: --offsets: {err.message}")
    config = load_or_exit(config_path, overrides)

    from specdraft.trainer.layer_probe import LayerProbeSettings, render_layers_text
    from specdraft.trainer.layer_probe.explain import explain_layers as measure_layers

    settings = LayerProbeSettings(
        samples=samples,
        eval_samples=eval_samples,
        positions=positions,
        offsets=parsed,
        vocab=vocab,
        count=count,
        seed=seed,
    )
    try:
        report = measure_layers(config, settings, progress=True)
    except (OSError, ValueError) as err:
        # ValueError covers an empty corpus (data.EmptyCorpusError) and unusable settings.
        _fail(f"explain-layers: {config_path}: {err}")
    if fmt == "json":
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(render_layers_text(report, config_path), nl=False)
