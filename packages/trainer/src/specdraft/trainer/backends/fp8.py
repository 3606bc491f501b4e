"""fp8_linear: torchao Float8Linear with float8 all-gather, FSDP2 on CUDA only."""

from __future__ import annotations

from torch import nn

from .options import BackendOptions


class Fp8Unavailable(RuntimeError):
    """fp8_linear was asked for where it cannot run."""


def check_fp8_supported(options: BackendOptions) -> None:
    """Refuse fp8 off CUDA or off FSDP2, with the reason and the fix."""
    if options.device.type != "cuda":
        raise Fp8Unavailable(
            "training.fp8_linear needs a CUDA device (float8 matmuls); this run is on "
            f"{options.device.type}: set fp8_linear = false"
        )
    if options.backend != "fsdp2":
        raise Fp8Unavailable("training.fp8_linear needs training.backend = 'fsdp2'")
    try:
        import torchao  # noqa: F401
    except ImportError as exc:
        raise Fp8Unavailable(
            "training.fp8_linear needs torchao: pip install 'specdraft-trainer[fp8]'"
        ) from exc


def apply_fp8_linear(model: nn.Module, options: BackendOptions) -> None:
    """Swap the draft blocks' nn.Linear for Float8Linear (token counts are multiples of 16)."""
    check_fp8_supported(options)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig(enable_fsdp_float8_all_gather=True)

    def only_block_linears(module: nn.Module, fqn: str) -> bool:
        # Only the blocks: fc's input width (layers x hidden) and small heads stay in bf16.
        return isinstance(module, nn.Linear) and fqn.startswith("layers.")

    convert_to_float8_training(model, config=config, module_filter_fn=only_block_linears)
