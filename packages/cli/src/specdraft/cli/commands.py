"""The list of `specdraft` subcommands. Add a command by importing it here."""

from __future__ import annotations

import click


def all_commands() -> list[click.Command]:
    """Every subcommand, imported lazily so `--help` and `lint` never import torch."""
    from .config_cmd import config
    from .explain_cmd import explain_buckets
    from .lint_cmd import lint
    from .serve_capture_cmd import serve_capture
    from .train_cmd import train

    commands: list[click.Command] = [lint, config, explain_buckets, train, serve_capture]
    return commands
