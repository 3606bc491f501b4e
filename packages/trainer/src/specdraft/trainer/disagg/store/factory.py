"""Open the feature store a config names: kept apart from the store protocol so that the
protocol's module imports neither implementation (and neither imports it back through here)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from .base import ROLES, FeatureStore, local_store_root

if TYPE_CHECKING:
    from specdraft.config import DisaggregatedConfig


def open_store(cfg: DisaggregatedConfig, run_dir: Path, *, role: str) -> FeatureStore:
    """The feature store `deployment.disaggregated.store` names, opened for `role`."""
    if role not in ROLES:
        raise ValueError(f"store role {role!r} is not one of {', '.join(ROLES)}")
    if cfg.store == "local":
        from .local import LocalFeatureStore

        return LocalFeatureStore(local_store_root(run_dir))
    if cfg.store == "mooncake":
        from .mooncake import MooncakeFeatureStore

        return MooncakeFeatureStore(cfg.mooncake, timeout_s=cfg.store_timeout_s, role=role)
    raise ValueError(
        f"deployment.disaggregated.store = {cfg.store!r} is not a known store; use 'local' or "
        f"'mooncake'"
    )
