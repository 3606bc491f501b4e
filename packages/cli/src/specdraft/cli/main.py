"""The `specdraft` command group. Heavy imports (torch, transformers) stay inside command bodies."""

from __future__ import annotations

import importlib

import click

from . import __version__
from .commands import COMMANDS, SUMMARIES


class LazyGroup(click.Group):
    """A group whose subcommands are imported by name, only when one is invoked or asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        """Every command name, in table order."""
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        """Import and return one command (None for an unknown name: click says so)."""
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attribute = target.split(":")
        return getattr(importlib.import_module(module_name), attribute)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """List commands from the summary table without importing them."""
        rows = [(name, SUMMARIES.get(name, "")) for name in self.list_commands(ctx)]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(
    cls=LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
)
@click.version_option(__version__, prog_name="specdraft")
def cli() -> None:
    """Train speculative-decoding draft models (DFlash, DFlash2, DSpark) for SGLang-served targets.

    \b
    specdraft lint config.toml             check configs (pre-commit hook)
    specdraft explain-buckets config.toml  dry run: pad lengths and what they cost
    specdraft train config.toml            train a drafter (FSDP1 / FSDP2, local or disaggregated)
    """


def main() -> None:
    """Entry point of the `specdraft` script."""
    cli(prog_name="specdraft")
