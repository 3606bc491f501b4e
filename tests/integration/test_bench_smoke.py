"""The static-shape benchmark harness (bench/static_shapes.py): its rules and a toy-size run.

The smoke test runs the real harness for two optimizer steps per variant on the toy preset and
checks the tables' columns and that every variant trained; it asserts no timing. The other tests
pin the rules the tables rest on: synthetic workloads, deltas against the baseline, the targets.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))

from shapebench.checks import bucket_checks, recompile_findings  # noqa: E402
from shapebench.results import RunResult  # noqa: E402
from shapebench.tables import OFFLINE_COLUMNS, offline_table, parse_table  # noqa: E402
from shapebench.variants import BY_KEY, VARIANTS, parse_variants  # noqa: E402
from shapebench.workloads import (  # noqa: E402
    MIN_SUPERVISED,
    PREFIX_SHARES,
    SYNTHETIC_LENGTHS,
    parse_workloads,
    synthetic_samples,
)

# ------------------------------------------------------------------------- synthetic workloads


@settings(max_examples=60, deadline=None)
@given(
    workload=st.sampled_from(sorted(SYNTHETIC_LENGTHS)),
    max_length=st.integers(min_value=16, max_value=16384),
    count=st.integers(min_value=1, max_value=40),
    seed=st.integers(min_value=0, max_value=2**31),
)
def test_synthetic_samples_stay_in_their_ranges(workload, max_length, count, seed):
    low_share, high_share = SYNTHETIC_LENGTHS[workload]
    samples = synthetic_samples(workload, max_length=max_length, count=count, seed=seed)
    assert len(samples) == count
    for sample in samples:
        assert low_share * max_length <= sample.length <= high_share * max_length
        # The workload's prefix share (rounded), but always an anchor and a supervised token
        # after it.
        low_prefix, high_prefix = PREFIX_SHARES[workload]
        assert sample.length - sample.prefix >= MIN_SUPERVISED
        assert sample.prefix <= high_prefix * sample.length + 0.5
        floor = min(low_prefix * sample.length - 0.5, sample.length - MIN_SUPERVISED)
        assert sample.prefix >= floor


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2**31))
def test_synthetic_samples_are_the_same_for_every_variant(seed):
    # Every variant's process regenerates the data: the same seed must give the same samples.
    first = synthetic_samples("long", max_length=1024, count=32, seed=seed)
    again = synthetic_samples("long", max_length=1024, count=32, seed=seed)
    assert first == again


def test_low_supervision_has_one_valid_anchor_per_16_positions():
    # The anchor workload: on average 1 valid anchor per 16 positions, so at the presets'
    # density (num_anchors = max_length / 16) many micro-batches have fewer valid anchors than
    # num_anchors, which the note's 20-80% prefix (`variable`) almost never gives.
    from shapebench.presets import PRESETS

    preset = PRESETS["cpu"]
    assert preset.max_length == 16 * preset.num_anchors

    def valid(sample):  # anchors a with a and a + 1 supervised
        return sample.length - sample.prefix - 1

    low = synthetic_samples("low-supervision", max_length=1024, count=2000, seed=1)
    share = sum(s.length - s.prefix for s in low) / sum(s.length for s in low)
    assert 1 / 16 - 0.005 < share < 1 / 16 + 0.005
    short = sum(valid(s) < preset.num_anchors for s in low) / len(low)
    note = synthetic_samples("variable", max_length=1024, count=2000, seed=1)
    assert short > 0.5
    assert sum(valid(s) < preset.num_anchors for s in note) / len(note) < 0.05


def test_long_lengths_cover_most_of_their_range():
    # "Uniform in 1/8-1 of max_length": a large draw reaches near both ends of the range.
    lengths = [s.length for s in synthetic_samples("long", max_length=8192, count=2000, seed=3)]
    assert min(lengths) < 8192 / 8 + 200
    assert max(lengths) > 8192 - 200


def test_selection_errors_name_the_choices():
    with pytest.raises(ValueError, match="buckets-compile"):
        parse_variants("static,bukets")
    with pytest.raises(ValueError, match="sharegpt"):
        parse_workloads("variable,offline")
    assert [v.key for v in parse_variants("all")] == [v.key for v in VARIANTS]


@pytest.mark.subprocess
def test_bad_selection_exits_with_usage_error():
    done = subprocess.run(
        [sys.executable, str(BENCH / "static_shapes.py"), "--variants", "nope"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "--variants: unknown nope" in done.stderr


# ------------------------------------------------------------------------------ tables, targets


def _row(variant: str, step_ms: float, **fields) -> RunResult:
    # Median and mean step time equal unless a test sets the mean itself.
    fields.setdefault("compute_ms_mean", step_ms)
    row = RunResult("long", "dflash2", variant, step_ms=step_ms, **fields)
    row.peak_memory_mb = fields.get("peak_memory_mb", 1000.0)
    return row


def test_deltas_are_taken_against_the_baseline_row():
    rows = [
        _row("static", 150.0, positions_per_real_token=2.0),
        _row("fsdp2", 100.0, positions_per_real_token=1.2),
        _row("buckets", 90.0, positions_per_real_token=1.5),
    ]
    table = parse_table(offline_table(rows, preferred_baseline="fsdp2"))
    by_variant = {row["variant"]: row for row in table}
    assert [row["variant"] for row in table] == [
        BY_KEY[key].label for key in ("fsdp2", "static", "buckets")
    ]  # rows come in the reference's order whatever order they ran in
    assert by_variant[BY_KEY["fsdp2"].label]["Δ vs fsdp2"] == "–"
    assert by_variant[BY_KEY["static"].label]["Δ vs fsdp2"].startswith("+50")
    assert by_variant[BY_KEY["buckets"].label]["Δ vs fsdp2"].startswith("-10")


def test_failed_run_keeps_its_row_with_the_reason():
    rows = [_row("fsdp2", 100.0), RunResult("long", "dflash2", "static", status="failed")]
    rows[1].reason = "RuntimeError: out of memory"
    table = parse_table(offline_table(rows))
    assert "out of memory" in table[1]["steady step time"]


def test_baseline_falls_back_when_the_preferred_one_did_not_run():
    rows = [_row("static", 150.0), _row("buckets", 120.0)]
    text = offline_table(rows, preferred_baseline="fsdp2")
    assert "Δ vs static" in text.splitlines()[0]


@settings(max_examples=50, deadline=None)
@given(
    static_ppt=st.floats(min_value=1.0, max_value=8.0),
    removed=st.floats(min_value=0.0, max_value=0.9),
    saved=st.floats(min_value=-1.0, max_value=0.9),
    tolerance=st.floats(min_value=0.0, max_value=0.2),
)
def test_bucket_target_is_saving_at_least_removed_padding_minus_tolerance(
    static_ppt, removed, saved, tolerance
):
    rows = [
        _row("static", 1000.0, positions_per_real_token=static_ppt),
        _row("buckets", 1000.0 * (1 - saved), positions_per_real_token=static_ppt * (1 - removed)),
    ]
    (check,) = bucket_checks(rows, tolerance=tolerance)
    assert check.padding_removed == pytest.approx(removed)
    assert check.step_time_saved == pytest.approx(saved)
    if saved >= removed - tolerance + 1e-9:
        assert check.met
    elif saved <= removed - tolerance - 1e-9:
        assert not check.met
        assert "missed by" in check.describe()


def test_recompiles_after_warmup_are_reported_for_compiled_runs_only():
    compiled = _row("buckets-compile", 100.0, recompiles_after_warmup=3)
    eager = _row("buckets", 100.0, recompiles_after_warmup=2)
    findings = recompile_findings([compiled, eager])
    assert len(findings) == 1 and "3 recompile" in findings[0]


# ---------------------------------------------------------------------------------- smoke run


@pytest.mark.slow
def test_harness_trains_every_variant_at_toy_size(tmp_path):
    # No compile variants here (a cold compile costs a minute per shape on two cores).
    variants = ["fsdp1", "fsdp2", "static", "buckets"]
    out = tmp_path / "out"
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH / "static_shapes.py"),
            "--preset",
            "toy",
            "--variants",
            ",".join(variants),
            "--algorithms",
            "dflash2,dspark",
            "--workloads",
            "variable",
            "--steps",
            "2",
            "--work-dir",
            str(tmp_path / "work"),
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=540,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert {(r["algorithm"], r["variant"]) for r in runs} == {
        (a, v) for a in ("dflash2", "dspark") for v in variants
    }
    for run in runs:
        assert run["status"] == "ok", run
        assert run["steps"] == 2 and run["steady_steps"] == 1
        assert run["step_ms"] > 0 and run["peak_memory_mb"] > 0
        # Every row reports the model FLOP rate and MFU the run logged (train/flops.py).
        assert run["model_tflops_per_s"] > 0 and run["mfu"] > 0, run
        assert run["positions_per_real_token"] >= 1.0
    report = (out / "tables.md").read_text()
    assert report == done.stdout  # the printed report and the written one agree
    for section in report.split("### ")[1:]:
        table = parse_table(section)
        header = list(table[0])
        expected = [c.format(baseline="fsdp2", ranks="1 rank") for c in OFFLINE_COLUMNS]
        assert header == expected
        assert [row["variant"] for row in table] == [BY_KEY[v].label for v in variants]
        for row in table:
            assert row["steady step time"].endswith(" ms"), row
            assert row["model TFLOP/s (MFU)"].endswith("%)"), row
    # Padding to the longest sample never computes more positions than a static length.
    by_key = {(r["algorithm"], r["variant"]): r for r in runs}
    for algorithm in ("dflash2", "dspark"):
        longest = by_key[(algorithm, "fsdp2")]["positions_per_real_token"]
        assert longest <= by_key[(algorithm, "static")]["positions_per_real_token"]
        assert (
            by_key[(algorithm, "buckets")]["positions_per_real_token"]
            <= (by_key[(algorithm, "static")]["positions_per_real_token"])
        )


# ------------------------------------------------------------------ step-vs-length probe


@settings(max_examples=50, deadline=None)
@given(
    fixed=st.floats(min_value=0.0, max_value=1e4),
    slope=st.floats(min_value=0.0, max_value=10.0),
    lengths=st.lists(st.integers(1, 8192), min_size=2, max_size=6, unique=True),
)
def test_probe_fit_recovers_a_line(fixed, slope, lengths):
    from step_vs_length import fit_line

    intercept, fitted = fit_line([(n, fixed + slope * n) for n in lengths])
    assert fitted == pytest.approx(slope, rel=1e-6, abs=1e-9)
    assert intercept == pytest.approx(fixed, rel=1e-6, abs=1e-6)


@pytest.mark.slow
def test_probe_times_every_length_of_both_algorithms(tmp_path):
    done = subprocess.run(
        [
            *(sys.executable, str(BENCH / "step_vs_length.py")),
            *("--preset", "toy", "--rounds", "1", "--out", str(tmp_path)),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "probe.json").read_text())
    assert results["real_length"] == 128  # the toy preset's smallest bucket
    assert set(results["algorithms"]) == {"dflash2", "dspark"}
    for row in results["algorithms"].values():
        assert row["lengths"] == [128, 256]
        assert all(row["median_ms"][str(n)] > 0 for n in row["lengths"])
    assert (tmp_path / "probe.md").read_text() in done.stdout
