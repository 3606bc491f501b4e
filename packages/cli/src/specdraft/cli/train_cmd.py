"""`specdraft train CONFIG`: validate, then run the trainer ranks (or print the plan)."""

from __future__ import annotations

import json

import click

from .common import load_or_exit, overrides_option


@click.command("train")
@click.argument("config_path", metavar="CONFIG", type=click.Path(dir_okay=False, path_type=str))
@overrides_option
@click.option(
    "--resume",
    default=None,
    metavar="DIR|latest",
    help="Resume from a checkpoint folder, or 'latest' in output_dir (overrides "
    "training.resume_from).",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Validate, build the draft on the meta device and "
    "print the plan (ranks, backend, pad policy, compile plan, memory); do not train.",
)
@click.option(
    "--nproc-per-node",
    type=click.IntRange(min=1),
    default=None,
    help="Trainer ranks on this node (default: deployment.nproc_per_node).",
)
@click.option(
    "--nnodes", type=click.IntRange(min=1), default=None, help="Nodes (default: deployment.nnodes)."
)
@click.option(
    "--node-rank",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="This node's rank (multi-node, like torchrun).",
)
@click.option(
    "--master-addr",
    default="127.0.0.1",
    show_default=True,
    help="Rendezvous host (multi-node, like torchrun).",
)
@click.option(
    "--master-port",
    type=int,
    default=None,
    help="Rendezvous port (default: a free port on one node, 29500 on several).",
)
@click.option("--no-progress", is_flag=True, help="No progress bars (logs only).")
def train(
    config_path: str,
    overrides: tuple[str, ...],
    resume: str | None,
    dry_run: bool,
    nproc_per_node: int | None,
    nnodes: int | None,
    node_rank: int,
    master_addr: str,
    master_port: int | None,
    no_progress: bool,
) -> None:
    """Train a DFlash2 or DSpark drafter as CONFIG describes.

    \b
    Runs deployment.nproc_per_node ranks (x deployment.nnodes): under torchrun it joins that
    group, otherwise it starts the ranks itself (gloo on CPU, NCCL on CUDA). A bad config never
    starts a run; a crashed run resumes with --resume latest. With deployment.mode =
    "disaggregated" it trains on features captured online (see docs/disaggregated.md).
    """
    config = load_or_exit(config_path, overrides)
    # Heavy imports only now: `--help` and `lint` never pay for torch.
    from specdraft.trainer.launch import LaunchPlan, RankFailed, launch
    from specdraft.trainer.train.run import (
        dry_run_plan,
        launch_environment_defaults,
        rank_main,
        runtime_check_errors,
        target_check_errors,
    )

    errors = target_check_errors(config)
    if errors:
        raise click.ClickException(
            f"{config_path}: the config does not fit its target:\n  " + "\n  ".join(errors)
        )
    # Before any rank starts (and in --dry-run): what this machine cannot run, e.g. fp8 on CPU.
    errors = runtime_check_errors(config)
    if errors:
        raise click.ClickException(
            f"{config_path}: the config cannot run on this machine:\n  " + "\n  ".join(errors)
        )
    plan = LaunchPlan(
        nproc_per_node=nproc_per_node or config.deployment.nproc_per_node,
        nnodes=nnodes or config.deployment.nnodes,
        node_rank=node_rank,
        master_addr=master_addr,
        master_port=master_port,
    )
    if plan.world_size != config.deployment.world_size:
        overrides = (
            *overrides,
            f"deployment.nproc_per_node={plan.nproc_per_node}",
            f"deployment.nnodes={plan.nnodes}",
        )
        config = load_or_exit(config_path, overrides)
    if dry_run:
        for line in dry_run_plan(config, world_size=plan.world_size).lines:
            click.echo(line)
        return
    launch_environment_defaults()
    try:
        if config.deployment.mode == "disaggregated" and config.deployment.disaggregated.managed:
            from specdraft.trainer.disagg.managed import run_managed

            summary = run_managed(config_path, list(overrides), resume, plan, not no_progress)
        else:
            summary = launch(plan, rank_main, config_path, list(overrides), resume, not no_progress)
    except RankFailed as exc:
        raise click.ClickException(str(exc)) from None
    if summary:
        click.echo(json.dumps(summary, indent=2))
        for line in summary_lines(summary):
            click.echo(line)


def summary_lines(summary: dict) -> list[str]:
    """The run's outcome in words: loss first -> last, and tau before -> after training."""
    lines = []
    first, last = summary.get("first_loss"), summary.get("last_loss")
    if first is not None and last is not None:
        lines.append(f"loss: {first:.3f} -> {last:.3f} over {summary.get('final_step')} steps")
    evals = summary.get("evals") or []
    if len(evals) >= 2:
        before, after = evals[0], evals[-1]
        lines.append(
            f"tau before -> after training: {before['tau']:.2f} -> {after['tau']:.2f} "
            f"(tokens per verification step; step {before.get('step')} -> {after.get('step')})"
        )
    elif evals:
        lines.append(f"tau: {evals[-1]['tau']:.2f} at step {evals[-1].get('step')}")
    return lines
