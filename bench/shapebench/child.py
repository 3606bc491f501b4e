"""One benchmark run in a fresh process: `python -m shapebench.child RUN_DIR`.

RUN_DIR holds `config.toml` (the variant's config) and `run.json` (workload, seed, sample count,
ranks, feature source). The run goes through the real pieces: `build_trainer` (draft, backend,
compile, warm-up of every static length) and `Trainer.fit`; only the batch source is the
benchmark's (`BenchBatchSource`: padding tally, synthetic features when there is no target to
run). It writes the trainer's `metrics.jsonl`, the `summary.json` of `specdraft train`, and
`bench.json` with what the metrics do not hold (peak memory of every rank, the padding, anchor
and conversation tally, warm-up time). A fresh process per run keeps max RSS and Dynamo's
counters per variant.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

RUN_FILE = "run.json"
CONFIG_FILE = "config.toml"
BENCH_FILE = "bench.json"
SUMMARY_FILE = "summary.json"


def read_run_spec(run_dir: Path) -> dict[str, Any]:
    """The run's spec (written by the harness)."""
    return json.loads((run_dir / RUN_FILE).read_text())


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def _sharegpt_rows(config: Any, ctx: Any) -> tuple[Any, list[int], str]:
    """Tokenised ShareGPT rows, their lengths and fingerprint (rank 0 fills the cache first)."""
    from specdraft.trainer.data import build_dataset, sample_lengths

    if not ctx.is_main:
        _barrier()
    dataset, report = build_dataset(config, split="train", progress=False)
    if ctx.is_main:
        _barrier()
    return dataset, sample_lengths(dataset), report.fingerprint


def build_bench_source(config: Any, ctx: Any, spec: dict[str, Any], shapes: Any) -> Any:
    """The run's batch source: the workload's rows, the run's shape policy and sampler."""
    from shapebench.source import BenchBatchSource, SyntheticFeatures
    from shapebench.workloads import is_synthetic, synthetic_rows, synthetic_samples
    from specdraft.collate import sampler_from_config
    from specdraft.config.sampler_mode import sampler_mode
    from specdraft.trainer.backends import backend_options_from_config
    from specdraft.trainer.models import load_target_config
    from specdraft.trainer.train.assembly import batch_shape, load_run_data
    from specdraft.trainer.train.sources import BatchBuilder

    training = config.training
    workload = spec["workload"]
    extractor = None
    counts = None  # valid anchors per row, for anchor-grouped plans
    if is_synthetic(workload):
        samples = synthetic_samples(
            workload,
            max_length=config.data.max_length,
            count=spec["num_samples"],
            seed=spec["seed"],
        )
        dataset = synthetic_rows(samples, vocab_bound=spec["vocab_bound"], seed=spec["seed"])
        lengths = [sample.length for sample in samples]
        fingerprint = f"synthetic:{workload}:{spec['seed']}:{len(samples)}"
    elif spec["features"] == "target":
        data = load_run_data(config, ctx, progress=False)
        dataset, lengths, fingerprint, extractor, counts = (
            data.dataset,
            data.lengths,
            data.fingerprint,
            data.features,
            data.anchor_counts,  # the run assembly's own count, when anchor-grouped
        )
    else:
        dataset, lengths, fingerprint = _sharegpt_rows(config, ctx)
    options = backend_options_from_config(config, ctx.device, shapes=shapes)
    shape = batch_shape(config, load_target_config(config.model.target), options)
    synthetic = None
    if extractor is None:
        synthetic = SyntheticFeatures(
            feature_width=shape.feature_width,
            hidden_size=shape.hidden_size,
            with_last_hidden=shape.with_last_hidden,
            dtype=shape.feature_dtype,
            device=ctx.device,
            seed=spec["seed"],
        )
    # The run assembly's sampler, so batches are what training would see (anchor-grouped
    # plans read each row's valid anchors from its loss mask, as the run assembly does).
    if sampler_mode(config) == "anchor_grouped" and counts is None:
        from specdraft.collate import valid_anchor_count

        counts = [valid_anchor_count(dataset[i]["loss_mask"]) for i in range(len(lengths))]
    sampler = sampler_from_config(
        config,
        lengths,
        num_replicas=ctx.world_size,
        rank=ctx.rank,
        shapes=shapes,
        anchor_counts=counts,
    )
    return BenchBatchSource(
        dataset,
        sampler,
        builder=BatchBuilder(shapes=shapes, shape=shape, device=ctx.device),
        grad_accum_steps=training.grad_accum_steps,
        rank=ctx.rank,
        features=extractor,
        lengths=lengths,
        synthetic=synthetic,
        fingerprint=fingerprint,
    )


def _skip_checkpoint() -> None:
    """Stands in for Trainer.save: writing checkpoints is not what the benchmark measures."""
    return None


def rank_main(run_dir: str) -> dict[str, Any]:
    """What every rank of a benchmark run executes (picklable for the elastic launcher)."""
    import torch
    import torch.distributed as dist

    from specdraft.config import ShapePolicy, load_config
    from specdraft.trainer.runtime import init_distributed, shutdown_distributed
    from specdraft.trainer.train.assembly import build_trainer
    from specdraft.trainer.train.metrics import peak_memory_mb
    from specdraft.trainer.train.rank_entry import configure_logging

    folder = Path(run_dir)
    spec = read_run_spec(folder)
    config = load_config(folder / CONFIG_FILE)
    ctx = init_distributed()
    configure_logging(ctx.rank)
    try:
        # The run's one shape policy, shared by the source and the trainer.
        shapes = ShapePolicy.from_config(config)
        source = build_bench_source(config, ctx, spec, shapes)
        trainer = build_trainer(config, ctx, progress=False, source=source, shapes=shapes)
        trainer.save = _skip_checkpoint  # type: ignore[method-assign]
        timings: dict[str, float] = {}
        warmup = trainer.warmup

        def timed_warmup() -> None:
            start = time.perf_counter()
            warmup()
            timings["warmup_s"] = time.perf_counter() - start

        trainer.warmup = timed_warmup  # type: ignore[method-assign]
        start = time.perf_counter()
        result = trainer.fit()
        fit_s = time.perf_counter() - start
        # Peak memory of every rank (the metrics hold rank 0's only) and the padding tally.
        peaks = torch.zeros(ctx.world_size, dtype=torch.float64)
        peaks[ctx.rank] = peak_memory_mb(ctx.device)
        tally = torch.tensor(
            [
                source.tally.computed_positions,
                source.tally.real_tokens,
                source.tally.computed_anchor_blocks,
                source.tally.valid_anchor_blocks,
                source.tally.exact_anchor_blocks,
                source.tally.documents,
            ],
            dtype=torch.float64,
        )
        if dist.is_initialized() and ctx.world_size > 1:
            dist.all_reduce(peaks)
            dist.all_reduce(tally)
        summary = result.summary()  # the same summary.json as `specdraft train`
        if ctx.is_main:
            (folder / SUMMARY_FILE).write_text(json.dumps(summary, indent=2))
            bench = {
                "peak_memory_mb_per_rank": peaks.tolist(),
                "computed_positions": int(tally[0]),
                "real_tokens": int(tally[1]),
                "computed_anchor_blocks": int(tally[2]),
                "valid_anchor_blocks": int(tally[3]),
                "exact_anchor_blocks": int(tally[4]),
                "documents": int(tally[5]),
                "warmup_s": timings.get("warmup_s", 0.0),
                "fit_s": fit_s,
                "device": str(ctx.device),
                "world_size": ctx.world_size,
            }
            (folder / BENCH_FILE).write_text(json.dumps(bench, indent=2))
        trainer.writer.close()
        return summary
    finally:
        shutdown_distributed()


def main(argv: list[str]) -> int:
    """Run the benchmark run in RUN_DIR on the ranks its spec asks for."""
    if len(argv) != 1:
        print("usage: python -m shapebench.child RUN_DIR", file=sys.stderr)
        return 2
    from specdraft.trainer.launch import LaunchPlan, launch
    from specdraft.trainer.train.environment import launch_environment_defaults

    run_dir = str(Path(argv[0]).resolve())
    spec = read_run_spec(Path(run_dir))
    launch_environment_defaults()
    launch(LaunchPlan(nproc_per_node=int(spec["ranks"])), rank_main, run_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
