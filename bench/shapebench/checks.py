"""The issue's targets, checked on the measured rows (reported, never faked or asserted).

On the synthetic workloads, `static_shape_buckets` must beat `static_shapes` on step time by at
least the share of computed positions the buckets remove, minus a small overhead; compiled runs
must show zero recompiles after warm-up.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .results import RunResult

# Pairs compared: (buckets variant, static variant).
PAIRS = (("buckets", "static"), ("buckets-compile", "static-compile"))


@dataclass(frozen=True)
class BucketCheck:
    """Buckets vs static on one workload, algorithm and compile setting."""

    workload: str
    algorithm: str
    buckets: str
    static: str
    padding_removed: float  # share of static's computed positions the buckets do not compute
    step_time_saved: float  # 1 - t_buckets / t_static
    tolerance: float

    @property
    def met(self) -> bool:
        """True when the step time fell by at least the padding removed minus the tolerance."""
        return self.step_time_saved >= self.padding_removed - self.tolerance

    def describe(self) -> str:
        """One line for the report."""
        shortfall = self.padding_removed - self.tolerance - self.step_time_saved
        verdict = "met" if self.met else f"missed by {100 * shortfall:.1f} pts"
        return (
            f"{self.workload} / {self.algorithm}: {self.buckets} vs {self.static}: buckets remove "
            f"{100 * self.padding_removed:.1f}% of the computed positions, step time "
            f"{-100 * self.step_time_saved:+.1f}%; target (saving >= removed - "
            f"{100 * self.tolerance:.0f} pts): {verdict}"
        )


def bucket_checks(
    rows: Sequence[RunResult], *, tolerance: float, workloads: Sequence[str] = ("variable", "long")
) -> list[BucketCheck]:
    """Every buckets-vs-static pair that was measured on the synthetic workloads."""
    index = {(r.workload, r.algorithm, r.variant): r for r in rows if r.ok}
    checks = []
    for workload, algorithm in sorted({(r.workload, r.algorithm) for r in rows}):
        if workload not in workloads:
            continue
        for bucket_key, static_key in PAIRS:
            fast = index.get((workload, algorithm, bucket_key))
            slow = index.get((workload, algorithm, static_key))
            if fast is None or slow is None or not slow.positions_per_real_token:
                continue
            checks.append(
                BucketCheck(
                    workload,
                    algorithm,
                    bucket_key,
                    static_key,
                    1.0 - fast.positions_per_real_token / slow.positions_per_real_token,
                    # The mean, not the median: buckets make step times multi-modal, and the
                    # saving they buy is in the average step (throughput).
                    1.0 - fast.compute_ms_mean / slow.compute_ms_mean
                    if slow.compute_ms_mean
                    else 0.0,
                    tolerance,
                )
            )
    return checks


def recompile_findings(rows: Sequence[RunResult]) -> list[str]:
    """One line per compiled run that recompiled after warm-up (empty when none did)."""
    return [
        f"{r.workload} / {r.algorithm} / {r.variant}: {r.recompiles_after_warmup} recompile(s) "
        "after warm-up"
        for r in rows
        if r.ok and r.variant.endswith("-compile") and r.recompiles_after_warmup
    ]
