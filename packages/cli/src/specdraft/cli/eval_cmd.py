"""`specdraft eval CONFIG --checkpoint DIR`: acceptance length tau on held-out prompts."""

from __future__ import annotations

import json

import click

from .common import config_argument, format_option, load_or_exit, overrides_option


@click.command("eval")
@config_argument
@click.option(
    "--checkpoint",
    required=True,
    metavar="DIR|init",
    help="A checkpoint folder (checkpoints/step-*), or 'init' for a fresh draft.",
)
@overrides_option
@format_option("text", "json")
def eval_(config_path: str, checkpoint: str, overrides: tuple[str, ...], fmt: str) -> None:
    """Measure tau: mean tokens per verification step (bonus token included) against the
    target's greedy decoding of data.eval_paths, and the acceptance rate per block position."""
    config = load_or_exit(config_path, overrides)
    if not config.data.eval_paths:
        raise click.ClickException(
            f"{config_path}: data.eval_paths is empty; set it (or --set data.eval_paths=[...])"
        )
    from specdraft.trainer.train.eval_run import evaluate_checkpoint
    from specdraft.trainer.train.export import ExportError

    try:
        result = evaluate_checkpoint(config, checkpoint)
    except ExportError as exc:
        # A missing or corrupted checkpoint file: name it, no traceback.
        raise click.ClickException(str(exc)) from None
    if fmt == "json":
        click.echo(json.dumps(result, indent=2))
        return
    click.echo(f"tau = {result['tau']:.3f} over {int(result['steps'])} verification steps")
    rates = " ".join(f"{r:.2f}" for r in result["accept_rate_per_pos"])
    click.echo(f"acceptance per block position: {rates}")
    if result.get("capped_prompts"):
        click.echo(
            f"{int(result['capped_prompts'])} held-out prompt(s) cut from the left so prompt + "
            f"generated tokens fit data.max_length ({config.data.max_length})"
        )
