"""`specdraft lint FILE...`: check config files, `path:line:col: CODE message` per finding."""

from __future__ import annotations

import click

from .common import format_option


@click.command("lint")
@click.argument("files", nargs=-1, required=True, type=click.Path(path_type=str))
@format_option(
    "text",
    "json",
    help="text: one 'path:line:col: CODE message' line per finding; json: a list of objects.",
)
@click.option("--strict", is_flag=True, help="Treat warnings as errors (exit 1).")
@click.option(
    "--target",
    type=click.Path(path_type=str),
    default=None,
    help="Read the target model's config.json from PATH instead of model.target.",
)
@click.pass_context
def lint(ctx: click.Context, files: tuple[str, ...], fmt: str, strict: bool, target: str | None):
    """Check specdraft config files: schema, shape-bucket rules and target checks.

    \b
    Exit status: 0 clean (notes and warnings allowed), 1 findings,
    2 usage, I/O or TOML syntax errors. Codes: docs/config.md.
    """
    # Imported here so that `specdraft --help` stays instant; nothing on this path imports torch.
    from specdraft.config.lint import lint_file
    from specdraft.config.report import ExitCode, render_json, render_text, summary

    findings = [f for path in files for f in lint_file(path, strict=strict, target=target)]
    if fmt == "json":
        click.echo(render_json(findings))
    elif findings:
        click.echo(render_text(findings))
    click.echo(summary(findings, len(files)), err=True)
    ctx.exit(int(ExitCode.of(findings)))
