"""The backend contract: one frozen options object, built once per run from the config."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specdraft.config import CompilePlan, Config, ShapePolicy


@dataclass(frozen=True)
class BackendOptions:
    """Everything a backend's `prepare` needs, and nothing else."""

    backend: str  # a registered training backend (`specdraft.config.training_backends`)
    device: torch.device
    param_dtype: torch.dtype  # compute dtype of gathered parameters
    reduce_dtype: torch.dtype = torch.float32  # gradients are always reduced in fp32
    reshard_after_forward: bool = True
    compile_blocks: bool = False
    # The run's one shape policy: the compile plan counts its (length x anchor width) grid.
    shapes: ShapePolicy = field(default_factory=ShapePolicy)
    compile_with_eval: bool = False
    fp8_linear: bool = False

    def compile_plan(self, num_blocks: int) -> CompilePlan:
        """The compile plan these options imply for a draft with `num_blocks` blocks."""
        return self.shapes.compile_plan(
            compile_blocks=self.compile_blocks,
            with_eval=self.compile_with_eval,
            num_blocks=num_blocks,
        )


def resolve_param_dtype(mixed_precision: str, device: torch.device) -> torch.dtype:
    """'auto' computes in bf16 on CUDA and fp32 on CPU (bf16 matmuls are slow on CPUs)."""
    if mixed_precision == "bf16" or (mixed_precision == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return torch.float32


def backend_options_from_config(
    config: Config,
    device: torch.device,
    *,
    shapes: ShapePolicy,
    with_eval: bool | None = None,
) -> BackendOptions:
    """The run assembly's one place that turns the config into BackendOptions."""
    training = config.training
    if with_eval is None:
        with_eval = bool(config.data.eval_paths)
    return BackendOptions(
        backend=training.backend,
        device=device,
        param_dtype=resolve_param_dtype(training.mixed_precision, device),
        reshard_after_forward=training.reshard_after_forward,
        compile_blocks=training.compile_blocks,
        shapes=shapes,
        compile_with_eval=with_eval,
        fp8_linear=training.fp8_linear,
    )
