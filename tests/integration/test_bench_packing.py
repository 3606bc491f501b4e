"""The benchmark's packing rows: packed variants, the packed tally and features, the
packing checks, and bench/packing_quality.py (its table and a --quick run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))

from shapebench.checks import PACKED_SPEEDUP_TARGET, packing_checks  # noqa: E402
from shapebench.presets import PRESETS, TargetFacts, base_config  # noqa: E402
from shapebench.quality import (  # noqa: E402
    PACKED_EQUAL_BLOCKS,
    PACKED_EQUAL_TIME,
    UNPACKED,
    QualityRow,
    QualityRun,
    equal_time_steps,
    quality_table,
    quickstart_config,
    target_lines,
)
from shapebench.results import RunResult  # noqa: E402
from shapebench.runner import PACKED_SAMPLES_FACTOR, BenchSettings, num_samples  # noqa: E402
from shapebench.source import BenchBatchSource, SyntheticFeatures  # noqa: E402
from shapebench.tables import parse_table  # noqa: E402
from shapebench.variants import BY_KEY, parse_variants  # noqa: E402

from specdraft.config import ShapePolicy, validate_config  # noqa: E402

# ------------------------------------------------------------------------------ variants


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("key", ["packed", "packed-compile"])
def test_packed_rows_are_valid_static_configs_with_packing(preset, key):
    facts = TargetFacts("/nonexistent/target", (0, 1), 100, 4096)
    raw = base_config(PRESETS[preset], "dflash2", facts, seed=0, output_dir="out")
    raw["training"].update(
        BY_KEY[key].training_overrides(PRESETS[preset].buckets, PRESETS[preset].anchor_buckets)
    )
    config = validate_config(raw)
    assert config.training.packing and config.training.static_shapes
    assert not config.training.static_shape_buckets  # one static shape: every row is full
    assert config.training.compile_blocks == key.endswith("compile")
    assert ShapePolicy.from_config(config).row_capacity == PRESETS[preset].max_length


def test_only_packed_rows_read_more_samples():
    def samples(key: str) -> int:
        settings_ = BenchSettings(
            preset=PRESETS["toy"],
            algorithms=("dflash2",),
            variants=(BY_KEY[key],),
            workloads=("long",),
            steps=3,
            steady=1,
            ranks=2,
            seed=0,
            work_dir=Path("unused"),
        )
        return num_samples(settings_, BY_KEY[key])

    window = PRESETS["toy"].micro_batch_size * PRESETS["toy"].grad_accum_steps * 2
    assert samples("static") == 3 * window
    assert samples("packed") == samples("packed-compile") == 3 * window * PACKED_SAMPLES_FACTOR
    assert [v.key for v in parse_variants("packed,packed-compile")] == ["packed", "packed-compile"]


# ------------------------------------------------------------------- tally and features


def _source(lengths: list[int], capacity: int, packing: bool) -> BenchBatchSource:
    from specdraft.collate import MicroBatchSampler
    from specdraft.trainer.train.sources import BatchBuilder, BatchShape

    dataset = []
    for index, length in enumerate(lengths):
        mask = torch.ones(length, dtype=torch.long)
        mask[: length // 2] = 0  # an unsupervised prefix, as the synthetic workloads
        ids = torch.arange(length) % 50 + 1
        dataset.append({"input_ids": ids, "loss_mask": mask, "sample_id": 100 + index})
    policy = ShapePolicy(pad_to=capacity, num_anchors=4, packing=packing)
    shape = BatchShape(
        micro_batch_size=2,
        feature_width=6,
        hidden_size=3,
        with_last_hidden=True,
        feature_dtype=torch.float32,
        static=True,
    )
    sampler = MicroBatchSampler(lengths, micro_batch_size=2, grad_accum_steps=1, seed=0)
    features = SyntheticFeatures(
        feature_width=6,
        hidden_size=3,
        with_last_hidden=True,
        dtype=torch.float32,
        device=torch.device("cpu"),
        seed=5,
    )
    return BenchBatchSource(
        dataset,
        sampler,
        builder=BatchBuilder(shapes=policy, shape=shape),
        grad_accum_steps=1,
        rank=0,
        lengths=lengths,
        synthetic=features,
        fingerprint="test",
    )


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(min_value=3, max_value=32), min_size=1, max_size=5))
def test_packed_batch_features_are_each_documents_own(lengths):
    # Whatever row and offset a document lands at, its synthetic features are the ones it gets
    # alone (seeded by its sample id), and nothing is written outside the documents.
    source = _source(lengths, capacity=32, packing=True)
    indices = list(range(len(lengths)))
    rows = source.row_groups(lengths)
    if len(rows) > 2:  # more rows than micro_batch_size: the trainer refuses such a plan
        return
    packed = source.batch(indices)
    alone = _source(lengths, capacity=32, packing=False)
    for row, group in enumerate(rows):
        start = 0
        for position in group:
            single = alone.batch([position])
            length = lengths[position]
            for key in ("hidden_states", "target_last_hidden_states"):
                got = packed[key][row, start : start + length]
                assert torch.equal(got, single[key][0, :length])
            start += length
        assert not packed["hidden_states"][row, start:].any()
    assert source.tally.documents == len(lengths)
    assert source.tally.real_tokens == sum(lengths)
    assert source.tally.computed_positions == 2 * 32  # micro_batch_size rows of the capacity
    # Valid anchors per row: min(num_anchors, the row's documents' valid anchors together).
    valid = [source.anchor_count(p) for p in indices]
    expected = sum(min(4, sum(valid[p] for p in group)) for group in rows)
    assert source.tally.valid_anchor_blocks == expected


def test_unpacked_tally_counts_one_sample_per_row():
    source = _source([10, 20], capacity=32, packing=False)
    source.batch([0, 1])
    assert source.tally.documents == 2
    assert source.tally.valid_anchor_blocks == min(4, source.anchor_count(0)) + min(
        4, source.anchor_count(1)
    )


# --------------------------------------------------------------------------- checks, table


def _row(variant: str, workload: str = "sharegpt", **fields) -> RunResult:
    return RunResult(workload, "dflash2", variant, **fields)


def test_packing_checks_compare_with_the_same_static_stack():
    rows = [
        _row("static", samples_per_s=2.0, positions_per_real_token=1.8),
        _row("packed", samples_per_s=5.0, positions_per_real_token=1.02),
        _row("static-compile", samples_per_s=2.0, positions_per_real_token=1.8),
        _row("packed-compile", samples_per_s=3.0, positions_per_real_token=1.2),
        _row("static", "long", samples_per_s=2.0, positions_per_real_token=1.8),
        _row("packed", "long", samples_per_s=3.0, positions_per_real_token=1.1),
    ]
    checks = {(c.workload, c.packed): c for c in packing_checks(rows)}
    assert set(checks) == {
        ("sharegpt", "packed"),
        ("sharegpt", "packed-compile"),
        ("long", "packed"),
    }
    assert checks[("sharegpt", "packed")].speedup == pytest.approx(2.5)
    assert checks[("sharegpt", "packed")].speedup >= PACKED_SPEEDUP_TARGET
    assert "positions <= 1.05: met" in checks[("sharegpt", "packed")].describe()
    assert "samples/s >= 2x: met" in checks[("sharegpt", "packed")].describe()
    missed = checks[("sharegpt", "packed-compile")].describe()
    assert "positions <= 1.05: missed" in missed and "samples/s >= 2x: missed" in missed
    assert "no target on this workload" in checks[("long", "packed")].describe()


def _quality(name: str, seed: int = 42, **fields) -> QualityRow:
    return QualityRow(name, name != UNPACKED, seed, **fields)


def test_quality_table_and_targets():
    rows = [
        _quality(UNPACKED, steps=10, train_s=20.0, samples_per_s=2.0, tau_after=3.0),
        _quality(PACKED_EQUAL_BLOCKS, steps=10, train_s=22.0, samples_per_s=4.2, tau_after=2.97),
        _quality(PACKED_EQUAL_TIME, steps=9, train_s=19.8, samples_per_s=4.2, tau_after=2.9),
        QualityRow(PACKED_EQUAL_TIME, True, 7, status="failed", reason="boom | bang"),
    ]
    table = parse_table(quality_table(rows))
    names = [UNPACKED, PACKED_EQUAL_BLOCKS, PACKED_EQUAL_TIME, PACKED_EQUAL_TIME]
    assert [r["run"] for r in table] == names
    assert table[0]["Δ tau after vs unpacked"] == "–"
    assert table[1]["Δ tau after vs unpacked"] == "-1.0%"
    assert "failed: boom / bang" in table[3]["optimizer steps"]
    lines = "\n".join(target_lines(rows))
    assert "blocks (mean over 1 seed): packed 2.970 vs unpacked 3.000 (-1.0%)" in lines
    assert "within 2% of unpacked or better): met" in lines
    assert "equal time (mean over 1 seed): packed 2.900" in lines  # seed 7's failed row: left out
    assert "x2.10" in lines and "): met" in lines.splitlines()[-1]
    assert equal_time_steps(rows[0], rows[1]) == 9  # 20 s at 2.2 s per packed step


def test_equal_time_falls_back_to_the_equal_blocks_run_of_the_same_seed():
    # A seed whose equal-time step count equals the equal-blocks one trains no third run; its
    # equal-blocks run stands for both, and each seed is compared with its own unpacked run.
    rows = [
        _quality(UNPACKED, 1, steps=10, train_s=20.0, samples_per_s=2.0, tau_after=3.0),
        _quality(PACKED_EQUAL_BLOCKS, 1, steps=10, train_s=20.0, samples_per_s=4.0, tau_after=3.3),
        _quality(UNPACKED, 2, steps=10, train_s=20.0, samples_per_s=2.0, tau_after=4.0),
        _quality(PACKED_EQUAL_BLOCKS, 2, steps=10, train_s=25.0, samples_per_s=4.0, tau_after=4.1),
        _quality(PACKED_EQUAL_TIME, 2, steps=8, train_s=20.0, samples_per_s=4.0, tau_after=3.9),
    ]
    lines = target_lines(rows)
    assert "equal time (mean over 2 seeds): packed 3.600 vs unpacked 3.500" in lines[1]
    assert "blocks (mean over 2 seeds): packed 3.700 vs unpacked 3.500" in lines[0]


@pytest.mark.parametrize("packing", [False, True])
def test_quality_configs_differ_only_in_packing(packing, tmp_path):
    run = QualityRun(PACKED_EQUAL_BLOCKS if packing else UNPACKED, packing, 42, 12)
    raw = quickstart_config(
        run=run,
        algorithm="dspark",
        output_dir=tmp_path,
        train_path=tmp_path / "train.jsonl",
        eval_path=tmp_path / "eval.jsonl",
        target=tmp_path / "target",
    )
    config = validate_config(raw)
    assert config.training.packing is packing and config.training.static_shapes
    assert not config.training.static_shape_buckets
    assert config.training.max_steps == 12 and config.model.algorithm == "dspark"
    assert config.data.eval_paths == [str(tmp_path / "eval.jsonl")]


# -------------------------------------------------------------------------------- smoke runs


@pytest.mark.slow
def test_packed_rows_on_long_and_sharegpt_at_toy_size(tmp_path):
    # Eager only (compiled packed rows: tests/integration/test_packing_compile.py, which runs the
    # same build_trainer path): static and packed on both workloads.
    out = tmp_path / "out"
    done = subprocess.run(
        [
            *(sys.executable, str(BENCH / "static_shapes.py"), "--preset", "toy"),
            *("--variants", "static,packed", "--algorithms", "dflash2"),
            *("--workloads", "long,sharegpt", "--steps", "2"),
            *("--work-dir", str(tmp_path / "work"), "--out", str(out)),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())["runs"]
    runs = {(r["workload"], r["variant"]): r for r in results}
    assert set(runs) == {(w, v) for w in ("long", "sharegpt") for v in ("static", "packed")}
    for run in runs.values():
        assert run["status"] == "ok", run
        assert run["steps"] == 2
        assert run["anchors_per_conversation"] > 0
    for workload in ("long", "sharegpt"):
        static, packed = runs[(workload, "static")], runs[(workload, "packed")]
        # Every packed row holds one or more whole conversations. (Fewer positions per real
        # token than static is the benchmark's reading, not a rule: two steps are too few rows.)
        assert packed["positions_per_real_token"] >= 1.0
        assert packed["samples_per_step"] >= static["samples_per_step"]
    report = (out / "tables.md").read_text()
    assert "fsdp2 + static_shapes + packing" in report
    assert "packed vs static" in report


@pytest.mark.slow
def test_packing_quality_quick_prints_the_table(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(
        [
            *(sys.executable, str(BENCH / "packing_quality.py"), "--quick"),
            *("--work-dir", str(tmp_path / "work"), "--out", str(out)),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads((out / "results.json").read_text())["runs"]
    by_name = {r["name"]: r for r in runs}
    assert UNPACKED in by_name and PACKED_EQUAL_BLOCKS in by_name
    unpacked, packed = by_name[UNPACKED], by_name[PACKED_EQUAL_BLOCKS]
    assert unpacked["steps"] == packed["steps"] == 3
    # The same steps under one static shape: the same computed anchor blocks.
    assert unpacked["computed_anchor_blocks"] == packed["computed_anchor_blocks"]
    assert packed["conversations"] >= unpacked["conversations"]
    assert all(r["tau_after"] > 0 and r["tau_before"] > 0 for r in runs)
    table = parse_table(done.stdout)
    assert table[0]["run"] == UNPACKED
    assert (out / "tables.md").read_text() == done.stdout
