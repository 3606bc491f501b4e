"""specdraft config: the schema, TOML loading with overrides, bucket rules and the linter.

This package never imports torch, so `specdraft lint` stays fast enough for pre-commit.
"""

from .buckets import (
    CompilePlan,
    compile_plan,
    compile_plan_from,
    effective_buckets,
    effective_buckets_from,
    max_length_appended,
    static_lengths,
)
from .loader import ConfigError, apply_overrides, load_config, read_toml, validate_config
from .schema import (
    BUCKET_QUANTUM,
    Config,
    DataConfig,
    DeploymentConfig,
    DFlash2Options,
    DisaggregatedConfig,
    DSparkOptions,
    ModelConfig,
    MooncakeConfig,
    TrackingConfig,
    TrainingConfig,
)

__version__ = "0.1.0"

__all__ = [
    "BUCKET_QUANTUM",
    "CompilePlan",
    "Config",
    "ConfigError",
    "DFlash2Options",
    "DSparkOptions",
    "DataConfig",
    "DeploymentConfig",
    "DisaggregatedConfig",
    "ModelConfig",
    "MooncakeConfig",
    "TrackingConfig",
    "TrainingConfig",
    "apply_overrides",
    "compile_plan",
    "compile_plan_from",
    "effective_buckets",
    "effective_buckets_from",
    "load_config",
    "max_length_appended",
    "read_toml",
    "static_lengths",
    "validate_config",
]
