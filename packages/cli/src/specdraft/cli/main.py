"""The `specdraft` command group. Heavy imports (torch, transformers) stay inside command bodies."""

from __future__ import annotations

import click

from . import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="specdraft")
def cli() -> None:
    """Train speculative-decoding draft models (DFlash2, DSpark) for SGLang-served targets.

    \b
    specdraft lint config.toml             check configs (pre-commit hook)
    specdraft explain-buckets config.toml  dry run: pad lengths and what they cost
    specdraft train config.toml            train a drafter (FSDP1 / FSDP2, local or disaggregated)
    """


def _register() -> None:
    """Attach the commands; each lives in its own module."""
    # Each module defines one click command (or group) named after its file.
    from . import commands

    for command in commands.all_commands():
        cli.add_command(command)


def main() -> None:
    """Entry point of the `specdraft` script."""
    _register()
    cli(prog_name="specdraft")
