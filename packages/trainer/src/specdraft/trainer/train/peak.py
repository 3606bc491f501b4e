"""The peak FLOP rate MFU is measured against: configured, known for the GPU, or probed.

Order: `tracking.peak_tflops` when set; else the dense bf16 tensor-core peak of a known GPU
(by `torch.cuda.get_device_name`, the table below, vendor data sheets without sparsity); else
(CPU, or a GPU not in the table) the rate of a short square GEMM probe in the draft's compute
dtype, measured once per process and device.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch

# Dense bf16 TFLOP/s by device-name fragment; the first fragment the name contains wins, so the
# more specific names (PCIe, NVL) come before their family's.
GPU_PEAK_TFLOPS: tuple[tuple[str, float], ...] = (
    ("GB300", 2500.0),
    ("B300", 2250.0),
    ("GB200", 2500.0),
    ("B200", 2250.0),
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100 NVL", 835.0),
    ("H100", 989.0),
    ("H800", 989.0),
    ("H20", 148.0),
    ("A100", 312.0),
    ("A800", 312.0),
    ("L40S", 362.0),
    ("L4", 121.0),
    ("A10", 125.0),
    ("MI355X", 2500.0),
    ("MI325X", 1307.0),
    ("MI300X", 1307.0),
)

# The probe: a few square products of this size, the best rate counts (a busy machine's slow
# repeats are noise, not the hardware's rate).
PROBE_SIZE = 1024
PROBE_REPEATS = 10


@dataclass(frozen=True)
class Peak:
    """A peak rate in TFLOP/s and where it came from ('config', 'table', 'probe')."""

    tflops: float
    source: str

    def describe(self) -> str:
        """`989 TFLOP/s (NVIDIA H200, table)` and the like."""
        return f"{self.tflops:.4g} TFLOP/s ({self.source})"


def table_peak(device_name: str) -> float | None:
    """The table's dense bf16 peak of a GPU name, or None when the table does not know it."""
    for fragment, tflops in GPU_PEAK_TFLOPS:
        if fragment.lower() in device_name.lower():
            return tflops
    return None


@functools.cache
def probe_tflops(device_type: str, dtype: torch.dtype) -> float:
    """Measured TFLOP/s of a PROBE_SIZE-square GEMM on this device type (once per process)."""
    device = torch.device(device_type)
    generator = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(PROBE_SIZE, PROBE_SIZE, generator=generator).to(device, dtype)
    b = torch.randn(PROBE_SIZE, PROBE_SIZE, generator=generator).to(device, dtype)
    flops = 2 * PROBE_SIZE**3
    best = float("inf")
    for _ in range(PROBE_REPEATS + 1):  # the first one warms the kernel up
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        torch.mm(a, b)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return flops / best / 1e12


def resolve_peak(
    configured: float | None, device: torch.device | str, dtype: torch.dtype = torch.float32
) -> Peak:
    """The peak of `device`: configured, the GPU table's, or the GEMM probe's in `dtype`."""
    if configured is not None:
        return Peak(float(configured), "tracking.peak_tflops")
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        known = table_peak(name)
        if known is not None:
            return Peak(known, f"{name}, dense bf16")
        return Peak(probe_tflops("cuda", dtype), f"{name}, GEMM probe")
    return Peak(probe_tflops(device.type, dtype), f"{device.type} {dtype}, GEMM probe")
