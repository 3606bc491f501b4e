"""`specdraft audit RUN_DIR`: did every sample train exactly once per epoch?"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from .common import CONFIG_ERROR_EXIT


@click.command("audit")
@click.argument("run_dir", type=click.Path(path_type=Path))
def audit(run_dir: Path) -> None:
    """Check a local run's record of the samples each optimizer step trained.

    \b
    Prints, per epoch, how many samples trained once, more than once, or never (an epoch in
    progress counts what it trained so far). Exit status: 0 every sample of every finished
    epoch trained exactly once, 1 some trained twice or were skipped, 2 no record in RUN_DIR
    (a disaggregated run's producer ledger is its record: see docs/disaggregated.md).
    """
    from specdraft.trainer.train.sample_record import RECORD_NAME, audit_lines, audit_record

    path = run_dir / RECORD_NAME
    if not path.is_file():
        click.echo(
            f"Error: {path}: no record of trained samples; RUN_DIR must be the output_dir of a "
            "local `specdraft train` run (written from this version on)",
            err=True,
        )
        sys.exit(CONFIG_ERROR_EXIT)
    audits = audit_record(path)
    finished = (run_dir / "summary.json").is_file()
    lines, ok = audit_lines(audits, finished=finished)
    click.echo(f"{path}: {sum(a.steps for a in audits)} optimizer steps, {len(audits)} epoch(s)")
    for line in lines:
        click.echo(f"  {line}")
    click.echo("every sample trained exactly once per epoch" if ok else "NOT exactly once")
    if not ok:
        sys.exit(1)
