"""specdraft config: the schema, TOML loading with overrides, bucket rules and the linter.

This package never imports torch, so `specdraft lint` stays fast enough for pre-commit.
"""

from .buckets import (
    CompilePlan,
    compile_plan_from,
    effective_buckets,
    effective_buckets_from,
    max_length_appended,
)
from .families.dflash2 import DFlash2Options
from .families.dspark import DSparkOptions
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
from .shape_policy import PadTo, ShapePolicy, check_pad_to, effective_anchor_buckets
from .stores.mooncake import MooncakeConfig
from .target_info import suggest_target_layer_ids

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
    "PadTo",
    "ShapePolicy",
    "TrackingConfig",
    "TrainingConfig",
    "apply_overrides",
    "check_pad_to",
    "compile_plan_from",
    "effective_anchor_buckets",
    "effective_buckets",
    "effective_buckets_from",
    "load_config",
    "max_length_appended",
    "read_toml",
    "suggest_target_layer_ids",
    "validate_config",
]
