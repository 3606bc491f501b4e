"""Draft quality per compute, packed against unpacked: runs, rows, table.

Every run is the quickstart's config (tiny target, its own answers to ShareGPT prompts, held-out
eval set) under static shapes, unpacked or packed, trained by the benchmark child
(`python -m shapebench.child RUN_DIR`, the real `build_trainer` + `Trainer.fit` with the
in-process target), which also counts computed positions, real tokens, computed anchor blocks and
conversations. Under static shapes without anchor buckets every micro-batch computes
micro_batch_size rows x num_anchors anchor blocks whatever it holds, so equal optimizer steps are
equal computed anchor blocks (the table shows the counts). tau is the run's own evaluation on the
same held-out records: before training (step 0, the same draft for every run) and at the end.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tomllib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from .child import BENCH_FILE, CONFIG_FILE, RUN_FILE, SUMMARY_FILE
from .results import read_metrics_rows
from .runner import REPO_ROOT, child_env, failure_reason

QUICKSTART = REPO_ROOT / "examples" / "quickstart.toml"
# A packed run stops at max_steps; the epochs only have to be enough to get there.
PACKED_EPOCHS = 1000


# The three runs of a seed, as the table names them.
UNPACKED = "unpacked"
PACKED_EQUAL_BLOCKS = "packed, equal anchor blocks"
PACKED_EQUAL_TIME = "packed, equal time"


@dataclass(frozen=True)
class QualityRun:
    """One training run of the comparison."""

    name: str  # the row label (UNPACKED, PACKED_EQUAL_BLOCKS, PACKED_EQUAL_TIME)
    packing: bool
    seed: int
    max_steps: int | None  # None: the quickstart's epochs decide


@dataclass
class QualityRow:
    """What one run measured."""

    name: str
    packing: bool
    seed: int
    status: str = "ok"
    reason: str = ""
    steps: int = 0
    computed_anchor_blocks: int = 0
    conversations: int = 0  # conversations trained on (with repeats across epochs)
    train_s: float = 0.0  # sum of the steps' wall time (data, target features, compute)
    samples_per_s: float = 0.0  # conversations per second of train_s
    positions_per_real_token: float = 0.0
    anchors_per_conversation: float = 0.0
    tau_before: float = 0.0
    tau_after: float = 0.0
    last_loss: float = 0.0

    @property
    def ok(self) -> bool:
        """True when the run trained and was evaluated."""
        return self.status == "ok"

    @property
    def mean_step_s(self) -> float:
        """Mean wall time of one optimizer step."""
        return self.train_s / self.steps if self.steps else 0.0

    def to_dict(self) -> dict[str, Any]:
        """Plain data for results.json."""
        return asdict(self)


def quickstart_config(
    *,
    run: QualityRun,
    algorithm: str,
    output_dir: Path,
    train_path: Path,
    eval_path: Path,
    target: Path,
    max_eval_samples: int | None = None,
    max_length: int | None = None,
) -> dict[str, Any]:
    """The quickstart's config for one run: static shapes (no buckets), packed or not.

    `max_length` replaces the quickstart's 256, at which its conversations (221 tokens on
    average) leave packing little room: a longer row is where packing has padding to remove.
    """
    config = tomllib.loads(QUICKSTART.read_text(encoding="utf-8"))
    config["run_id"] = "packing-quality"
    config["output_dir"] = str(output_dir)
    model = config["model"]
    model["target"] = str(target)
    if algorithm != model["algorithm"]:
        model.pop(model["algorithm"], None)  # the other family's options table
        model["algorithm"] = algorithm
    data = config["data"]
    data["train_paths"] = [str(train_path)]
    data["eval_paths"] = [str(eval_path)]
    if max_eval_samples is not None:
        data["max_eval_samples"] = max_eval_samples
    if max_length is not None:
        data["max_length"] = max_length
    training = config["training"]
    # One static shape for both, so the only difference is packing (buckets would shorten the
    # unpacked rows and not the packed ones, which are full).
    training["static_shapes"] = True
    training.pop("static_shape_buckets", None)
    training.pop("static_anchor_buckets", None)
    training["packing"] = run.packing
    training["seed"] = run.seed
    training["log_interval"] = 1  # every step's wall time is summed
    if run.max_steps is not None:
        training["max_steps"] = run.max_steps
        if run.packing:
            training["num_epochs"] = PACKED_EPOCHS
    config["tracking"] = {"progress_bar": False}
    return config


def quickstart_max_length() -> int:
    """The quickstart's data.max_length (the rows' length unless --max-length says otherwise)."""
    return int(tomllib.loads(QUICKSTART.read_text(encoding="utf-8"))["data"]["max_length"])


def write_quality_run(run_dir: Path, config: dict[str, Any], *, algorithm: str, seed: int) -> None:
    """A fresh run folder with the validated config and the child's run.json."""
    import shutil

    from specdraft.config import validate_config
    from specdraft.config.toml_writer import dump_toml

    validate_config(config)
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    (run_dir / CONFIG_FILE).write_text(dump_toml(config, header=f"packing quality: {run_dir.name}"))
    spec = {
        "workload": "sharegpt",  # real conversations, the target in-process
        "algorithm": algorithm,
        "variant": run_dir.name,
        "seed": seed,
        "num_samples": 0,  # not synthetic: the config's files decide
        "ranks": 1,
        "vocab_bound": 0,
        "features": "target",
    }
    (run_dir / RUN_FILE).write_text(json.dumps(spec, indent=2))


def execute_quality_run(run_dir: Path, *, timeout_s: float | None) -> int | None:
    """Run the child on the folder; its exit code, or None when it overran `timeout_s`."""
    env = child_env()
    env.setdefault("OMP_NUM_THREADS", "1")  # as the Makefile's quickstart
    with (run_dir / "log.txt").open("wb") as log:
        try:
            done = subprocess.run(
                [sys.executable, "-m", "shapebench.child", str(run_dir)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=str(REPO_ROOT),
                timeout=timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return None
    return done.returncode


def read_quality_row(run: QualityRun, run_dir: Path, code: int | None) -> QualityRow:
    """The row of a finished run folder."""
    row = QualityRow(run.name, run.packing, run.seed)
    if code is None:
        row.status, row.reason = "timeout", "stopped (time limit)"
        return row
    if code != 0:
        row.status, row.reason = "failed", failure_reason(run_dir / "log.txt")
        return row
    metrics = read_metrics_rows(run_dir / "metrics.jsonl")
    summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    bench = json.loads((run_dir / BENCH_FILE).read_text())
    evals = [e for e in summary.get("evals", []) if "tau" in e]
    if not metrics or len(evals) < 2:
        row.status, row.reason = "failed", "no step or no evaluation logged"
        return row
    row.steps = len(metrics)
    row.train_s = sum(float(m["perf/step_ms"]) for m in metrics) / 1e3
    row.computed_anchor_blocks = int(bench["computed_anchor_blocks"])
    row.conversations = int(bench.get("documents", 0))
    row.samples_per_s = row.conversations / row.train_s if row.train_s else 0.0
    if bench.get("real_tokens"):
        row.positions_per_real_token = bench["computed_positions"] / bench["real_tokens"]
    if row.conversations:
        row.anchors_per_conversation = bench["valid_anchor_blocks"] / row.conversations
    row.tau_before = float(evals[0]["tau"])
    row.tau_after = float(evals[-1]["tau"])
    row.last_loss = float(summary.get("last_loss") or 0.0)
    return row


def equal_time_steps(unpacked: QualityRow, packed: QualityRow) -> int:
    """Packed steps that take the unpacked run's training time at the packed step time."""
    if not packed.mean_step_s:
        return 0
    return max(1, round(unpacked.train_s / packed.mean_step_s))


# ---------------------------------------------------------------------------------- the table

COLUMNS = (
    "run",
    "seed",
    "optimizer steps",
    "computed anchor blocks",
    "conversations trained",
    "training time",
    "samples/s",
    "computed positions per real token",
    "anchors per conversation",
    "tau before",
    "tau after",
    "Δ tau after vs unpacked",
)


def _cells(row: QualityRow, base: QualityRow | None) -> list[str]:
    if not row.ok:
        reason = f"{row.status}: {row.reason}".replace("|", "/")[:160]
        return [row.name, str(row.seed), reason] + ["–"] * (len(COLUMNS) - 3)
    delta = "–"
    if base is not None and base is not row and base.ok and base.tau_after:
        delta = f"{100 * (row.tau_after / base.tau_after - 1):+.1f}%"
    return [
        row.name,
        str(row.seed),
        str(row.steps),
        str(row.computed_anchor_blocks),
        str(row.conversations),
        f"{row.train_s:.1f} s",
        f"{row.samples_per_s:.2f}",
        f"{row.positions_per_real_token:.3f}",
        f"{row.anchors_per_conversation:.1f}",
        f"{row.tau_before:.3f}",
        f"{row.tau_after:.3f}",
        delta,
    ]


def quality_table(rows: list[QualityRow]) -> str:
    """One markdown table; each seed's packed rows are compared with its unpacked row."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    bases = {r.seed: r for r in rows if not r.packing}
    for row in rows:
        lines.append("| " + " | ".join(_cells(row, bases.get(row.seed))) + " |")
    return "\n".join(lines) + "\n"


# The packing targets: tau at equal computed anchor blocks within 2% of unpacked (or better),
# samples per second at least 2x unpacked static shapes.
TAU_TOLERANCE = 0.02
SPEEDUP_TARGET = 2.0


def seed_pairs(rows: list[QualityRow], name: str) -> list[tuple[QualityRow, QualityRow]]:
    """(unpacked, packed) per seed where both trained; `name`'s row, or for equal time the
    equal-blocks row when no equal-time run was needed (the step counts coincided)."""
    pairs = []
    for seed in sorted({r.seed for r in rows}):
        of_seed = {r.name: r for r in rows if r.seed == seed}
        base = of_seed.get(UNPACKED)
        other = of_seed.get(name)
        if other is None and name == PACKED_EQUAL_TIME:
            other = of_seed.get(PACKED_EQUAL_BLOCKS)
        if base is not None and other is not None and base.ok and other.ok:
            pairs.append((base, other))
    return pairs


def target_lines(rows: list[QualityRow]) -> list[str]:
    """The targets, on the means over the seeds where both runs of a comparison trained."""
    lines = []
    comparisons = (
        (PACKED_EQUAL_BLOCKS, "equal computed anchor blocks"),
        (PACKED_EQUAL_TIME, "equal time"),
    )
    for name, what in comparisons:
        pairs = seed_pairs(rows, name)
        if not pairs or not all(base.tau_after for base, _ in pairs):
            lines.append(f"- tau at {what}: not measured")
            continue
        base_tau = statistics.fmean(base.tau_after for base, _ in pairs)
        tau = statistics.fmean(other.tau_after for _, other in pairs)
        change = tau / base_tau - 1
        seeds = f"{len(pairs)} seed{'s' if len(pairs) > 1 else ''}"
        line = (
            f"- tau at {what} (mean over {seeds}): packed {tau:.3f} vs unpacked {base_tau:.3f} "
            f"({100 * change:+.1f}%)"
        )
        if name == PACKED_EQUAL_BLOCKS:
            verdict = "met" if change >= -TAU_TOLERANCE else "missed"
            line += f" (target: within 2% of unpacked or better): {verdict}"
        lines.append(line)
    pairs = seed_pairs(rows, PACKED_EQUAL_BLOCKS)
    if pairs and all(base.samples_per_s for base, _ in pairs):
        base_sps = statistics.fmean(base.samples_per_s for base, _ in pairs)
        sps = statistics.fmean(other.samples_per_s for _, other in pairs)
        ratio = sps / base_sps
        verdict = "met" if ratio >= SPEEDUP_TARGET else "missed"
        lines.append(
            f"- samples/s: packed {sps:.2f} vs unpacked static {base_sps:.2f} (x{ratio:.2f}; "
            f"target >= {SPEEDUP_TARGET:.0f}x): {verdict}"
        )
    return lines
