"""`specdraft config schema|show`: the config's JSON Schema and a resolved config."""

from __future__ import annotations

import click

from .common import format_option, overrides_option


@click.group("config")
def config() -> None:
    """Inspect the config schema and resolved configs."""


@config.command("schema")
def schema() -> None:
    """Print the JSON Schema of a config file (for editor completion, e.g. Even Better TOML)."""
    from specdraft.config.schema_json import render_json_schema

    click.echo(render_json_schema(), nl=False)


@config.command("show")
@click.argument("file", type=click.Path(path_type=str))
@overrides_option
@format_option("toml", "json")
@click.pass_context
def show(ctx: click.Context, file: str, overrides: tuple[str, ...], fmt: str) -> None:
    """Print FILE resolved: overrides applied and every default filled in.

    \b
    Exit status: 0 printed, 1 invalid config, 2 unreadable file, TOML
    syntax error or malformed --set. Errors go to stderr as path:line:col: CODE message.
    """
    from specdraft.config.diagnostics import findings_from_error
    from specdraft.config.loader import ConfigError, load_config
    from specdraft.config.report import ExitCode, render_text
    from specdraft.config.show import render_config

    try:
        resolved = load_config(file, overrides)
    except ConfigError as err:
        findings = findings_from_error(err, overrides)
        click.echo(render_text(findings), err=True)
        ctx.exit(int(ExitCode.of(findings)))
    click.echo(render_config(resolved, fmt), nl=False)
