"""specdraft config: the schema, TOML loading with overrides, bucket rules and the linter.

This package never imports torch, so `specdraft lint` stays fast enough for pre-commit.
"""

from .buckets import CompilePlan, compile_plan_from
from .loader import ConfigError, apply_overrides, load_config, read_toml, validate_config
from .schema import (
    BUCKET_QUANTUM,
    Config,
    DataConfig,
    DeploymentConfig,
    DisaggregatedConfig,
    ModelConfig,
    TrackingConfig,
    TrainingConfig,
)
from .serve import ServeConfig
from .shape_policy import (
    PadTo,
    ShapePolicy,
    check_pad_to,
    effective_anchor_buckets,
    effective_buckets_from,
)
from .target_info import suggest_target_layer_ids

__version__ = "0.1.0"

__all__ = [
    "BUCKET_QUANTUM",
    "CompilePlan",
    "Config",
    "ConfigError",
    "DataConfig",
    "DeploymentConfig",
    "DisaggregatedConfig",
    "ModelConfig",
    "PadTo",
    "ServeConfig",
    "ShapePolicy",
    "TrackingConfig",
    "TrainingConfig",
    "apply_overrides",
    "check_pad_to",
    "compile_plan_from",
    "effective_anchor_buckets",
    "effective_buckets_from",
    "load_config",
    "read_toml",
    "suggest_target_layer_ids",
    "validate_config",
]
