"""Open the feature store a config names, and the services a managed run starts for it.

A store is a module `disagg/store/<name>.py` named after its `deployment.disaggregated.store`
value, holding one `StoreKind` named `KIND` (how to open it, which services it needs); the config
package's store registry (`specdraft.config.stores.STORE_NAMES`) is the one registration line.
Kept apart from the protocol (`base`) so that no store module imports another through here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from specdraft.config.registry import load_one

from .base import ROLES, FeatureStore, StoreKind

if TYPE_CHECKING:
    from specdraft.config import Config, DisaggregatedConfig

    from ...runtime.service_process import ServiceSpec


def _no_module(name: str, module_name: str) -> ValueError:
    """The error for a store name without its trainer module: where it belongs."""
    return ValueError(
        f"deployment.disaggregated.store = {name!r} has no implementation: a store is a "
        f"module {module_name} holding a StoreKind named KIND"
    )


def store_kind(name: str) -> StoreKind:
    """The `StoreKind` of a store name: `disagg/store/<name>.py`'s KIND."""
    return load_one(
        "specdraft.trainer.disagg.store", name, StoreKind, attr="KIND", missing=_no_module
    )


def open_store(cfg: DisaggregatedConfig, run_dir: Path, *, role: str) -> FeatureStore:
    """The feature store `deployment.disaggregated.store` names, opened for `role`."""
    if role not in ROLES:
        raise ValueError(f"store role {role!r} is not one of {', '.join(ROLES)}")
    return store_kind(cfg.store).open(cfg, Path(run_dir), role)


def store_services(config: Config) -> list[ServiceSpec]:
    """The services a managed run starts for its store, before anything else (in order)."""
    return list(store_kind(config.deployment.disaggregated.store).managed_services(config))
