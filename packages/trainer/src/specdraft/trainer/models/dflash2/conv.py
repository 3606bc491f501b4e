"""DFlash2's dynamic depthwise convolution along the block, wrapped around a sublayer.

    y_t = sum_j (base[j, c] + delta_t[j, g(c)]) * x_(t-j)[c],   j = 0..taps-1

`base` is a learned kernel per channel; `delta_t` is a correction computed from the hidden state
at t and shared by the `group_size` channels of group g(c). Shifted inputs are zero before the
block's first token, so taps never cross a block boundary (every block is an independent draft).

One `kernel_projection` of the sublayer input yields both coefficient sets: `prepare` convolves
the sublayer input with the first and hands back the second, which `finish` applies to the
sublayer output. Parameter names follow the published DFlash2 checkpoints
(`attention_conv.base_kernel [2, taps, H]`, `attention_conv.kernel_projection.weight
[2 * taps * H / group_size, H]`, same for `mlp_conv`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class BlockDepthwiseConv(nn.Module):
    """Two-sided dynamic depthwise conv over the tokens of each block (see module docstring)."""

    def __init__(self, hidden_size: int, block_size: int, taps: int, group_size: int) -> None:
        super().__init__()
        if hidden_size % group_size:
            raise ValueError(
                f"conv_group_size {group_size} must divide the hidden size {hidden_size}"
            )
        self.block_size = block_size
        self.taps = taps
        self.group_size = group_size
        self.groups = hidden_size // group_size
        self.base_kernel = nn.Parameter(torch.empty(2, taps, hidden_size))
        self.kernel_projection = nn.Linear(hidden_size, 2 * taps * self.groups, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Identity at start: base tap 0 = 1, other taps 0, no dynamic correction."""
        with torch.no_grad():
            self.base_kernel.zero_()
            self.base_kernel[:, 0] = 1.0
            self.kernel_projection.weight.zero_()

    def _convolve(self, x: Tensor, delta: Tensor, base: Tensor) -> Tensor:
        """x [B, T, H], delta [B, T, taps, G], base [taps, H] -> [B, T, H]."""
        batch, length, hidden = x.shape
        blocks = x.view(batch, length // self.block_size, self.block_size, hidden)
        grouped_base = base.view(self.taps, self.groups, self.group_size)
        out = None
        for tap in range(self.taps):
            # Shift by `tap` inside each block; positions before the block start read zeros.
            shifted = F.pad(blocks, (0, 0, tap, 0))[:, :, : self.block_size]
            shifted = shifted.reshape(batch, length, self.groups, self.group_size)
            coefficient = grouped_base[tap] + delta[:, :, tap, :, None]
            term = coefficient * shifted
            out = term if out is None else out + term
        return out.reshape(batch, length, hidden)

    def prepare(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Convolve the sublayer input; return it and the finishing correction [B, T, taps, G]."""
        batch, length, _ = x.shape
        delta = self.kernel_projection(x).view(batch, length, 2, self.taps, self.groups)
        return self._convolve(x, delta[:, :, 0], self.base_kernel[0]), delta[:, :, 1]

    def finish(self, x: Tensor, delta: Tensor) -> Tensor:
        """Convolve the sublayer output with the correction `prepare` returned."""
        return self._convolve(x, delta, self.base_kernel[1])
