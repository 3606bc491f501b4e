"""Trainer.fit of several configs in one process group, reporting what the backend tests compare.

Run as a subprocess (a fresh process per group keeps torch.distributed and Dynamo state out of
pytest): `python -c "...; fit_probe.main()" NPROC CONFIG OVERRIDE_SETS_JSON [TWEAKS_JSON]`. One
rank runs in this process; more ranks are started by `specdraft.trainer.launch.launch`, exactly as
`specdraft train` starts them. Prints one JSON line: rank 0's list of per-run reports.

Tweaks break a run on purpose, after `build_trainer` and before `fit`: `recompile_limit` lowers
Dynamo's limit below what the compile plan set; `pad_to_longest` makes the train loader ignore
the run's pad policy; `unpacked_warmup` makes a packed run warm up on dummies without the packed
keys. A run that raises is reported with its error, and the runs after it are
skipped.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def _count_reduce_scatters() -> list[int]:
    """Count gradient reduce-scatters (FSDP1 and FSDP2 both call dist.reduce_scatter_single)."""
    import torch.distributed as dist

    calls = [0]
    original = dist.reduce_scatter_single

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls[0] += 1
        return original(*args, **kwargs)

    dist.reduce_scatter_single = counted
    return calls


def apply_tweaks(trainer: Any, tweaks: dict[str, Any]) -> None:
    """Break the run as the tweaks ask (see the module docstring)."""
    import torch

    from specdraft.collate import DataCollatorWithPadding

    if "recompile_limit" in tweaks:
        torch._dynamo.config.recompile_limit = int(tweaks["recompile_limit"])
    if tweaks.get("pad_to_longest"):
        trainer.source.builder.collate = DataCollatorWithPadding(pad_to=None)
    if tweaks.get("unpacked_warmup"):
        builder = trainer.source.builder
        packed_warmup = builder.warmup_batches

        def unpacked() -> list:
            # The packed run's warm-up cells without their packed keys.
            builder.packing = False
            try:
                return packed_warmup()
            finally:
                builder.packing = True

        builder.warmup_batches = unpacked


def fit_runs(
    config_path: str, override_sets: list[list[str]], tweaks: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """Build and fit one trainer per override set in this rank's group; return their reports."""
    import torch

    from specdraft.config import load_config
    from specdraft.trainer.runtime import init_distributed, shutdown_distributed
    from specdraft.trainer.train.assembly import build_trainer

    ctx = init_distributed()
    calls = _count_reduce_scatters()
    reports = []
    try:
        for overrides in override_sets:
            config = load_config(config_path, overrides)
            trainer = build_trainer(config, ctx, progress=False)
            head = [p.detach().clone() for p in trainer.head.parameters()]
            head_ids = {id(p) for p in trainer.head.parameters()}
            apply_tweaks(trainer, tweaks or {})
            before = calls[0]
            try:
                result = trainer.fit()
            except Exception as exc:
                reports.append({"overrides": overrides, "error": [type(exc).__name__, str(exc)]})
                break
            trainer.writer.close()
            reports.append(
                {
                    "overrides": overrides,
                    "loss": [r.loss for r in result.history],
                    "grad_norm": [r.metrics["grad_norm"] for r in result.history],
                    "loss_weight": [r.metrics["loss_weight"] for r in result.history],
                    "pad_lengths": [r.metrics.get("data/pad_lengths") for r in result.history],
                    "anchor_widths": [r.metrics.get("data/anchor_widths") for r in result.history],
                    "samples": [r.samples for r in result.history],
                    "anchors_per_conversation": [
                        r.metrics.get("data/anchors_per_conversation") for r in result.history
                    ],
                    "reduce_scatters": calls[0] - before,
                    "steps": result.final_step,
                    "compile_graphs": result.compile_graphs,
                    "recompiles_after_warmup": result.recompiles_after_warmup,
                    "compile_metrics": [
                        [
                            r.metrics.get("compile/graphs"),
                            r.metrics.get("compile/recompiles_after_warmup"),
                        ]
                        for r in result.history
                    ],
                    "model_type": type(trainer.model).__name__,
                    "head_in_model": any(id(p) in head_ids for p in trainer.model.parameters()),
                    "head_unchanged": all(
                        torch.equal(a, b)
                        for a, b in zip(head, trainer.head.parameters(), strict=True)
                    ),
                    "head_trainable": any(p.requires_grad for p in trainer.head.parameters()),
                }
            )
    finally:
        shutdown_distributed()
    return reports


def main() -> None:
    """Command-line entry: NPROC CONFIG OVERRIDE_SETS_JSON [TWEAKS_JSON]."""
    from specdraft.trainer.launch import LaunchPlan, launch

    nproc, config_path, sets = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3])
    tweaks = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    reports = launch(LaunchPlan(nproc_per_node=nproc), fit_runs, config_path, sets, tweaks)
    print(json.dumps(reports))
