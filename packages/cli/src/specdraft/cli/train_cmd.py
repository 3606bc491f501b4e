"""`specdraft train CONFIG`: validate, then run the trainer ranks (or print the plan)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from specdraft.config.resume_contract import DATA_ORDER_FIELDS, check_allow_changed

from .common import CONFIG_ERROR_EXIT, config_argument, load_or_exit, overrides_option

# Kept here, not imported from the trainer: `--help` never pays for torch
# (specdraft.trainer.train.preempt has the same values; a test checks they agree).
STOPPED_EXIT = 75
DEFAULT_STOP_TIMEOUT = 120.0


@click.command("train")
@config_argument
@overrides_option
@click.option(
    "--resume",
    default=None,
    metavar="DIR|latest",
    help="Resume from a checkpoint folder, or 'latest' in output_dir (overrides "
    "training.resume_from).",
)
@click.option(
    "--allow-changed",
    "allow_changed",
    multiple=True,
    metavar="FIELD[,FIELD...]",
    help="With --resume: accept a changed data order for these fields (any of "
    + ", ".join(DATA_ORDER_FIELDS)
    + "); by default a resume that would repeat or skip samples is refused, naming the field. "
    "Repeatable.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Validate, build the draft on the meta device and "
    "print the plan (ranks, backend, pad policy, packing, compile plan, memory); do not train.",
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
@click.option(
    "--overwrite",
    is_flag=True,
    help="Start a new run in an output_dir that holds one: its checkpoints and metrics are moved "
    "into output_dir/replaced-<time>/ first (nothing is deleted).",
)
@click.option(
    "--stop-timeout",
    type=click.FloatRange(min=0),
    default=DEFAULT_STOP_TIMEOUT,
    show_default=True,
    metavar="SECONDS",
    help="After SIGTERM / Ctrl-C: the most seconds the step in progress plus the checkpoint may "
    "take before the ranks exit without saving (0: no limit). Set it below your cluster's grace.",
)
@click.option("--no-progress", is_flag=True, help="No progress bars (logs only).")
def train(
    config_path: str,
    overrides: tuple[str, ...],
    resume: str | None,
    allow_changed: tuple[str, ...],
    dry_run: bool,
    nproc_per_node: int | None,
    nnodes: int | None,
    node_rank: int,
    master_addr: str,
    master_port: int | None,
    overwrite: bool,
    stop_timeout: float,
    no_progress: bool,
) -> None:
    """Train a DFlash, DFlash2 or DSpark drafter as CONFIG describes.

    \b
    Runs deployment.nproc_per_node ranks (x deployment.nnodes): under torchrun it joins that
    group, otherwise it starts the ranks itself (gloo on CPU, NCCL on CUDA). A bad config never
    starts a run; a crashed run resumes with --resume latest. With deployment.mode =
    "disaggregated" it trains on features captured online (see docs/disaggregated.md).

    \b
    One run per output_dir: a second `specdraft train` on a folder in use is refused (naming
    the holder), and a new run into a folder that holds checkpoints or metrics needs
    --resume latest or --overwrite.
    \b
    Preemption: on SIGTERM or Ctrl-C (to this process, or to every rank, as schedulers and
    torchrun send it) every rank finishes its optimizer step, they save one checkpoint
    together and the run exits with status 75 (stopped, resumable: --resume latest continues
    exactly as if it had not stopped). That takes at most one step plus one save, and never
    more than --stop-timeout seconds (default 120); a second signal, or that deadline, stops
    at once without saving (status 128 + signal). Other statuses: 0 done, 1 a rank failed
    (or two checkpoint saves in a row failed, e.g. a full disk), 2 a usage or config error.
    """
    config = load_or_exit(config_path, overrides)
    allowed = check_resume_options(config, resume, allow_changed)
    # Heavy imports only now: `--help` and `lint` never pay for torch.
    from specdraft.config import ConfigError
    from specdraft.config.report import format_config_error
    from specdraft.trainer.launch import LaunchPlan
    from specdraft.trainer.request import RunRequest
    from specdraft.trainer.train.dry_run import dry_run_plan
    from specdraft.trainer.train.preflight import (
        data_path_errors,
        runtime_check_errors,
        target_check_errors,
        target_weight_errors,
    )

    # The dry run plans from config.json alone; a run reads the weights and data: check them
    # now, before any rank loads the target.
    errors = target_check_errors(config) or ([] if dry_run else target_weight_errors(config))
    if errors:
        usage_exit(f"{config_path}: the config does not fit its target:\n  " + "\n  ".join(errors))
    errors = [] if dry_run else data_path_errors(config)
    if errors:
        usage_exit(f"{config_path}: the data cannot be read:\n  " + "\n  ".join(errors))
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
    # The one request every layer of the run reads (the deployment mode, the ranks, the
    # managed run's services); the launch's rank counts become overrides when they differ.
    try:
        request = RunRequest.create(
            config_path,
            overrides,
            launch=plan,
            resume=resume,
            allow_changed=allowed,
            progress=not no_progress,
            stop_timeout_s=stop_timeout,
            overwrite=overwrite,
        )
    except ConfigError as err:
        click.echo(format_config_error(err, request_overrides(overrides, plan)), err=True)
        sys.exit(CONFIG_ERROR_EXIT)
    if dry_run:
        for line in dry_run_plan(request.config, world_size=plan.world_size).lines:
            click.echo(line)
        return
    report_outcome(run_or_exit(request))


def request_overrides(overrides: tuple[str, ...], plan: Any) -> tuple[str, ...]:
    """The overrides a request with this launch loads (for the error of a bad rank count)."""
    return (
        *overrides,
        f"deployment.nproc_per_node={plan.nproc_per_node}",
        f"deployment.nnodes={plan.nnodes}",
    )


def run_or_exit(request: Any) -> dict | None:
    """Run the request in its deployment mode (the trainer decides which); rank 0's summary.
    A busy or used output folder exits 2, a failed rank 1, a hard stop 128 + signal."""
    from specdraft.trainer.deployment import run_request
    from specdraft.trainer.launch import RankFailed, StoppedAtOnce
    from specdraft.trainer.train.run_folder import RunFolderError

    try:
        return run_request(request)
    except RunFolderError as exc:
        usage_exit(str(exc))
    except StoppedAtOnce as exc:
        click.echo(f"Error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except RankFailed as exc:
        raise click.ClickException(str(exc)) from None


def report_outcome(summary: dict | None) -> None:
    """Print rank 0's summary and exit with the status --help documents."""
    from specdraft.trainer.train.rank_entry import USER_ERROR

    if not summary:
        return
    # Under torchrun every rank is a `specdraft train`: rank 0 speaks, all exit alike.
    quiet = os.environ.get("RANK", "0") != "0"
    if USER_ERROR in summary:
        if quiet:
            sys.exit(CONFIG_ERROR_EXIT)
        usage_exit(summary[USER_ERROR])
    stopped = summary.get("stopped")
    if not quiet:
        click.echo(json.dumps(summary, indent=2))
        for line in summary_lines(summary):
            click.echo(line)
        if stopped == "signal":
            click.echo(
                f"{summary.get('stop_message')} at step {summary.get('final_step')}: "
                f"checkpoint {summary.get('checkpoint')}; continue with --resume latest",
                err=True,
            )
        elif stopped:
            click.echo(f"Error: {summary.get('stop_message')}", err=True)
    if stopped:
        sys.exit(STOPPED_EXIT if stopped == "signal" else 1)


def usage_exit(message: str) -> NoReturn:
    """Print a usage error (what is wrong and the fix) to stderr and exit 2."""
    click.echo(f"Error: {message}", err=True)
    sys.exit(CONFIG_ERROR_EXIT)


def check_resume_options(
    config: Any, resume: str | None, allow_changed: tuple[str, ...]
) -> tuple[str, ...]:
    """Refuse, before any rank starts, a --resume with nothing to resume or unknown fields."""
    from specdraft.trainer.train.checkpoint import find_latest, nothing_to_resume_message

    names = [name for item in allow_changed for name in item.split(",")]
    try:
        allowed = check_allow_changed(names)
    except ValueError as exc:
        usage_exit(str(exc))
    if allowed and resume is None and config.training.resume_from is None:
        usage_exit("--allow-changed only applies to a resume: add --resume latest (or a folder)")
    if resume == "latest" and find_latest(config.output_dir) is None:
        usage_exit(nothing_to_resume_message(config.output_dir))
    if resume not in (None, "latest") and not (Path(resume) / "trainer_state.json").is_file():
        usage_exit(
            f"--resume {resume}: not a complete checkpoint folder (no trainer_state.json); "
            "use --resume latest or a checkpoints/step-* folder"
        )
    return allowed


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
