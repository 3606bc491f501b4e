"""Shared by the commands: the CONFIG argument, the --set and --format options, and loading a
config or exiting with its errors."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any

import click

# Exit status of a config that cannot be used (same as `lint` for I/O and syntax errors).
CONFIG_ERROR_EXIT = 2


def config_argument(func: Callable[..., Any]) -> Callable[..., Any]:
    """The `CONFIG` argument (a TOML config file), passed as `config_path`."""
    return click.argument(
        "config_path", metavar="CONFIG", type=click.Path(dir_okay=False, path_type=str)
    )(func)


def format_option(*choices: str, help: str = "Output format.") -> Callable[..., Any]:
    """The `--format` option over `choices` (the first is the default), passed as `fmt`."""
    return click.option(
        "--format",
        "fmt",
        type=click.Choice(list(choices)),
        default=choices[0],
        show_default=True,
        help=help,
    )


def overrides_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """The repeatable `--set key.path=value` option, passed as `overrides`."""
    return click.option(
        "--set",
        "overrides",
        multiple=True,
        metavar="KEY=VALUE",
        help="Override a config value (a TOML literal), e.g. --set training.max_steps=10; "
        "validated like the file. Repeatable.",
    )(func)


def load_or_exit(path: str, overrides: Sequence[str] = ()) -> Any:
    """Load and validate a config; on failure print `path:line:col: CODE message` and exit 2."""
    from specdraft.config import ConfigError, load_config
    from specdraft.config.report import format_config_error

    try:
        return load_config(path, overrides)
    except ConfigError as err:
        click.echo(format_config_error(err, overrides).rstrip("\n"), err=True)
        sys.exit(CONFIG_ERROR_EXIT)
