"""The tracking backends by name, and opening the ones a run selects (rank 0 only).

A backend is one module of this folder, `<name>_sink.py`, that defines `BACKEND` (`base.Backend`);
its name is registered once, in the config package (`specdraft.config.tracking.BACKENDS`, which
the schema's `tracking.backends` admits), and found here by that name.
"""

from __future__ import annotations

import logging
from pathlib import Path

from specdraft.config import Config
from specdraft.config.registry import load_one
from specdraft.config.tracking import (
    BACKEND_NAMES,
    install_hint,
    missing_backend_message,
    missing_backends,
)

from .base import Backend, MetricSink, SinkContext, TrackingUnavailable

log = logging.getLogger(__name__)

# Backend name -> its module in this folder: `<name>_sink.py`, the sink of package `<name>`.
MODULES = {name: f"{name}_sink" for name in BACKEND_NAMES}


def backend(name: str) -> Backend:
    """The registered backend `name` (its module is imported, its package is not)."""
    return load_one(
        "specdraft.trainer.train.tracking", name, Backend, attr="BACKEND", module=MODULES[name]
    )


def run_files() -> tuple[str, ...]:
    """What the backends write under output_dir by default (a run's files, for --overwrite)."""
    return tuple(f for name in MODULES for f in backend(name).run_files)


def tracking_errors(config: Config) -> list[str]:
    """One line per selected backend whose package is missing here (checked before ranks start)."""
    return [missing_backend_message(config, name) for name in missing_backends(config)]


def open_sinks(config: Config, output_dir: Path) -> list[MetricSink]:
    """Open every selected backend, in order; the first that cannot start raises (and the ones
    opened before it are closed again)."""
    errors = tracking_errors(config)
    if errors:
        raise TrackingUnavailable(errors[0])
    context = SinkContext(config, output_dir)
    sinks: list[MetricSink] = []
    for name in config.tracking.selected_backends:
        try:
            sinks.append(backend(name).open(context))
        except ImportError as exc:  # found, but broken (a version clash among its dependencies)
            close_all(sinks)
            raise TrackingUnavailable(
                f"tracking backend {name!r}: its package does not import ({exc}); "
                f"reinstall it: {install_hint(name)}"
            ) from exc
        except Exception as exc:  # a refused login, an unreachable server: before step 1
            close_all(sinks)
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise TrackingUnavailable(
                f"tracking backend {name!r} did not start: {type(exc).__name__}: {first[:300]}"
            ) from exc
        log.info("metrics: mirrored to %s", name)
    return sinks


def close_all(sinks: list[MetricSink]) -> None:
    """Close sinks, logging (not raising) what fails: the run's outcome is already decided."""
    for sink in sinks:
        try:
            sink.close()
        except Exception as exc:
            log.warning("metrics: closing %s failed: %s", type(sink).__name__, exc)
