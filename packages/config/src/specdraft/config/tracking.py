"""Tracking backends as the linter and `specdraft train` see them: names, packages, extras.

`BACKENDS` below is the one registration line of a backend: the schema's `tracking.backends`
admits these names, and the trainer finds each one's module by it. A name is also the package
the backend imports and the specdraft-trainer extra that installs it, so a missing package can be
named with the command that fixes it before any rank starts. Whether a package is there is asked
without importing it.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

from .finding import Problem
from .positions import KeyPath

if TYPE_CHECKING:
    # Only for annotations: the schema reads BACKEND_NAMES from here.
    from .schema import Config

# The registered backends, in the order docs list them: each name a module
# `specdraft/trainer/train/tracking/<name>_sink.py` (its BACKEND), with its clause in
# `tracking.backends`' help where the name alone says too little.
BACKENDS: dict[str, str] = {
    "tensorboard": "",
    "wandb": "Weights & Biases; WANDB_MODE=offline keeps the run on disk, `wandb sync` uploads it",
    "mlflow": "",
}

BACKEND_NAMES: tuple[str, ...] = tuple(BACKENDS)


def install_hint(name: str) -> str:
    """The command that installs a backend's package."""
    return f"pip install 'specdraft-trainer[{name}]'"


def installed(module: str) -> bool:
    """Whether `module` can be imported here (found on the path; nothing is imported)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package that is missing or broken
        return False


def selected_key(config: Config, name: str) -> KeyPath:
    """The key that selects backend `name`: `tracking.backends`, or `tracking.tensorboard`."""
    if name in config.tracking.backends:
        return ("tracking", "backends")
    return ("tracking", name)


def missing_backends(config: Config) -> list[str]:
    """The selected backends whose package is not installed here."""
    return [n for n in config.tracking.selected_backends if not installed(n)]


def missing_backend_message(config: Config, name: str) -> str:
    """One line: which key selects the backend, what is missing, the command that fixes it."""
    path = selected_key(config, name)
    key = ".".join(str(part) for part in path)
    undo = f"drop {name!r} from {key}" if path[-1] == "backends" else f"set {key} = false"
    return (
        f"{key} selects {name!r}, but the {name} package is not installed here: "
        f"{install_hint(name)} (or {undo})"
    )


def tracking_problems(config: Config) -> list[Problem]:
    """SD501 for each selected backend whose package is missing, where training would run.

    Checked only where specdraft-trainer is installed: a pre-commit or config-only environment
    lints configs for a cluster it is not, and its missing extras say nothing about that one.
    """
    if not installed("specdraft.trainer"):
        return []
    return [
        Problem("SD501", selected_key(config, name), missing_backend_message(config, name))
        for name in missing_backends(config)
    ]
