"""The whole markdown report: the setting, one table per workload and algorithm, the targets."""

from __future__ import annotations

import datetime as dt
import os
import platform
from collections.abc import Sequence

from .checks import (
    anchor_checks,
    bucket_checks,
    low_supervision_checks,
    packing_checks,
    recompile_findings,
)
from .results import RunResult
from .runner import BenchSettings
from .tables import offline_table, online_table
from .workloads import WORKLOAD_NOTES

ALGORITHM_NAMES = {"dflash": "DFlash", "dflash2": "DFlash2", "dspark": "DSpark"}


def machine_description() -> str:
    """The device the runs computed on, and the software."""
    import torch

    if torch.cuda.is_available():
        device = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
    else:
        model = platform.processor() or platform.machine()
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
                names = [line for line in cpuinfo if line.startswith("model name")]
            model = names[0].split(":", 1)[1].strip() if names else model
        except OSError:
            pass
        device = f"CPU: {os.cpu_count()} cores ({model})"
    return f"{device}; torch {torch.__version__}, Python {platform.python_version()}"


def setting_lines(settings: BenchSettings) -> list[str]:
    """The sizes every table of the run shares."""
    preset = settings.preset
    buckets = "/".join(str(b) for b in (*preset.buckets, preset.max_length))
    return [
        f"- preset `{preset.name}`: {preset.description}",
        f"- max_length {preset.max_length}, buckets {buckets}, num_anchors {preset.num_anchors}, "
        f"block {preset.block_size}, batch {preset.micro_batch_size} x accum "
        f"{preset.grad_accum_steps} x {settings.ranks} rank(s), draft dtype {preset.dtype}",
        f"- {settings.steps} optimizer steps per run, steady state = the last {settings.steady} "
        f"(median train compute per step; compiles are pre-warmed and any after warm-up is "
        f"counted), seed {settings.seed}; every variant in a fresh process",
    ]


def render_report(
    settings: BenchSettings,
    results: Sequence[RunResult],
    *,
    command: str,
    machine: str,
    baseline: str,
    tolerance: float,
) -> str:
    """The markdown report of one invocation (partial results render too)."""
    lines = [
        "# Static-shape benchmark",
        "",
        f"- command: `{command}`",
        f"- machine: {machine}",
        f"- date: {dt.datetime.now().strftime('%Y-%m-%d %H:%M')}",
        *setting_lines(settings),
        "",
    ]
    for workload in settings.workloads:
        lines += [f"## {workload}: {WORKLOAD_NOTES[workload]}", ""]
        render = online_table if workload == "online" else offline_table
        for algorithm in settings.algorithms:
            rows = [r for r in results if r.workload == workload and r.algorithm == algorithm]
            if not rows:
                continue
            lines += [f"### {ALGORITHM_NAMES.get(algorithm, algorithm)}", ""]
            lines += [render(rows, preferred_baseline=baseline)]
    lines += ["## Targets", ""]
    checks = bucket_checks(results, tolerance=tolerance)
    lines += [f"- {check.describe()}" for check in checks] or [
        "- buckets vs static: not measured (needs both rows on variable or long)"
    ]
    lines += [f"- {check.describe()}" for check in anchor_checks(results)]
    lines += [f"- {line}" for line in low_supervision_checks(results, baseline=baseline)]
    lines += [f"- {check.describe()}" for check in packing_checks(results)]
    compiled = [r for r in results if r.ok and r.variant.endswith("-compile")]
    findings = recompile_findings(results)
    if findings:
        lines += [f"- recompiles after warm-up: {line}" for line in findings]
    elif compiled:
        lines += [f"- recompiles after warm-up: none in {len(compiled)} compiled run(s)"]
    return "\n".join(lines) + "\n"
