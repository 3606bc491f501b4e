"""`specdraft curves RUN_DIR...`: held-out tau against step and training time, run by run."""

from __future__ import annotations

import json
from pathlib import Path

import click

from .common import CONFIG_ERROR_EXIT, format_option


def _fail(message: str) -> None:
    click.echo(message, err=True)
    raise SystemExit(CONFIG_ERROR_EXIT)


@click.command("curves")
@click.argument(
    "run_dirs", metavar="RUN_DIR...", nargs=-1, required=True, type=click.Path(path_type=Path)
)
@click.option(
    "--out",
    "out",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Draw the curves into this PNG file (needs the trainer's [plot] extra, matplotlib).",
)
@click.option(
    "--label",
    "labels",
    multiple=True,
    metavar="NAME",
    help="A name for each run, in order (default: the run folder's name). Repeat once per run.",
)
@click.option(
    "--reach",
    "reach_taus",
    multiple=True,
    type=float,
    metavar="TAU",
    help="Print the training time and step at which each run's held-out tau first reaches TAU "
    "(linear between evaluations), or 'not reached'. Repeatable.",
)
@click.option(
    "--x",
    "x_axis",
    type=click.Choice(["both", "step", "time"]),
    default="both",
    show_default=True,
    help="The plot's x axis: optimizer step, training time, or both side by side.",
)
@click.option(
    "--clock",
    type=click.Choice(["wall", "cpu"]),
    default="wall",
    show_default=True,
    help="Training time as wall seconds inside optimizer steps, or as the CPU seconds the run's "
    "process spent there (time/train_cpu_s): the fair clock for runs that shared a busy machine "
    "(compare one-thread runs; CPU time adds up every thread).",
)
@click.option(
    "--tokens",
    type=click.IntRange(min=1),
    metavar="N",
    help="Judge each run as served with N speculative tokens a step (vLLM's "
    "num_speculative_tokens, llama.cpp's --draft-max): tau becomes the acceptance of the "
    "block's first N positions, so drafts of other block sizes compare at the setting they "
    "would be served with. Default: the whole block.",
)
@format_option("text", "json", help="Text for people, JSON (the parsed curves) for machines.")
def curves(
    run_dirs: tuple[Path, ...],
    out: Path | None,
    labels: tuple[str, ...],
    reach_taus: tuple[float, ...],
    x_axis: str,
    clock: str,
    tokens: int | None,
    fmt: str,
) -> None:
    """Learning curves: held-out tau of one or several runs, against step and training time.

    \b
    RUN_DIR is a run's output_dir (its metrics.jsonl; a metrics file itself also works). A run
    evaluates every training.eval_interval steps when data.eval_paths is set; each evaluation
    is a point. Training time is the time spent in optimizer steps (data wait included; warm-up,
    evaluation and checkpoint saves excluded), so runs of other eval intervals compare fairly,
    and a resumed run continues its own clock. Exit status: 0, or 2 when a run has no
    metrics.jsonl or no evaluation.
    """
    from specdraft.trainer.curves.read import CurveError, read_curve
    from specdraft.trainer.curves.table import curves_json, render_text

    if labels and len(labels) != len(run_dirs):
        _fail(f"curves: {len(labels)} --label for {len(run_dirs)} runs: give one per run, in order")
    names = list(labels) or _default_labels(run_dirs)
    try:
        read = [read_curve(run, name, clock) for run, name in zip(run_dirs, names, strict=True)]
    except CurveError as err:
        _fail(f"curves: {err}")
    if tokens is not None:
        read = [curve.served_at(tokens) for curve in read]
    plot = None
    if out is not None:
        from specdraft.trainer.curves.plot import save_curves_plot

        try:
            save_curves_plot(read, out, x_axis, tokens)
        except (OSError, RuntimeError, ValueError) as err:
            _fail(f"curves: cannot write the plot {out}: {err}")
        plot = str(out)
        untimed = [c.label for c in read if not c.timed]
        if untimed and x_axis != "step":
            click.echo(
                f"curves: the time panel leaves out {', '.join(untimed)}: no training time "
                "recorded (a run of an older specdraft)",
                err=True,
            )
        click.echo(f"plot written to {out}", err=True)
    if fmt == "json":
        click.echo(json.dumps(curves_json(read, reach_taus, plot, tokens), indent=2))
    else:
        click.echo(render_text(read, reach_taus, clock, tokens), nl=False)


def _default_labels(run_dirs: tuple[Path, ...]) -> list[str]:
    """Each run's folder name, or the paths as given when two runs share a name."""
    names = [(run.parent if run.is_file() else run).resolve().name or str(run) for run in run_dirs]
    return names if len(set(names)) == len(names) else [str(run) for run in run_dirs]
