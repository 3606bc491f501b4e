"""The specdraft command line.

`main.py` is the click group; `commands.py` lists each subcommand as `module:function` with its
one-line summary, and the group imports a command's module only when it runs, so `--help` and
`lint` never import torch. One `<name>_cmd.py` module per command; `common.py` holds the CONFIG
argument, the `--set` / `--format` options and config loading with `path:line:col` errors.
"""

__version__ = "0.1.0"
