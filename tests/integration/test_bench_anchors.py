"""The benchmark's anchor dimension: anchor-bucket rows, the anchor-block tally, and
the probe's t(L, A) fit."""

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

from shapebench.presets import PRESETS  # noqa: E402
from shapebench.results import RunResult  # noqa: E402
from shapebench.tables import OFFLINE_COLUMNS, offline_table, parse_table  # noqa: E402
from shapebench.variants import BY_KEY  # noqa: E402

from specdraft.config import validate_config  # noqa: E402


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize(
    "key",
    ["static-anchors", "buckets-anchors", "static-anchors-compile", "buckets-anchors-compile"],
)
def test_anchor_rows_are_valid_configs_with_anchor_buckets(preset, key):
    from shapebench.presets import TargetFacts, base_config

    facts = TargetFacts("/nonexistent/target", (0, 1), 100, 4096)
    raw = base_config(PRESETS[preset], "dflash2", facts, seed=0, output_dir="out")
    raw["training"].update(
        BY_KEY[key].training_overrides(PRESETS[preset].buckets, PRESETS[preset].anchor_buckets)
    )
    config = validate_config(raw)
    assert config.training.static_anchor_buckets == list(PRESETS[preset].anchor_buckets)
    assert config.training.static_shapes
    assert bool(config.training.static_shape_buckets) == key.startswith("buckets")
    assert config.training.compile_blocks == key.endswith("compile")


def test_the_table_has_the_anchor_blocks_column():
    rows = [
        RunResult(
            "variable", "dflash2", "static", status="ok", step_ms=100.0, compute_ms_mean=100.0,
            anchor_blocks_per_valid=2.5,
        ),
        RunResult(
            "variable", "dflash2", "static-anchors", status="ok", step_ms=60.0,
            compute_ms_mean=60.0, anchor_blocks_per_valid=1.04,
        ),
    ]  # fmt: skip
    table = parse_table(offline_table(rows, preferred_baseline="static"))
    assert "computed anchor blocks per valid anchor" in OFFLINE_COLUMNS
    assert [r["computed anchor blocks per valid anchor"] for r in table] == ["2.50", "1.04"]


@settings(max_examples=50, deadline=None)
@given(
    fixed=st.floats(min_value=0.0, max_value=1e4),
    per_position=st.floats(min_value=0.0, max_value=1.0),
    per_block=st.floats(min_value=0.0, max_value=50.0),
    lengths=st.lists(st.integers(1, 8192), min_size=2, max_size=4, unique=True),
    widths=st.lists(st.integers(1, 512), min_size=2, max_size=4, unique=True),
)
def test_probe_plane_fit_recovers_a_plane(fixed, per_position, per_block, lengths, widths):
    from step_vs_length import fit_plane

    points = [(L, A, fixed + per_position * L + per_block * A) for L in lengths for A in widths]
    c, a, b = fit_plane(points)
    assert a == pytest.approx(per_position, rel=1e-5, abs=1e-7)
    assert b == pytest.approx(per_block, rel=1e-5, abs=1e-6)
    assert c == pytest.approx(fixed, rel=1e-5, abs=1e-3)


@pytest.mark.slow
def test_probe_times_every_length_x_anchor_cell(tmp_path):
    out = tmp_path / "probe"
    done = subprocess.run(
        [
            sys.executable,
            str(BENCH / "step_vs_length.py"),
            "--preset", "toy", "--rounds", "1", "--algorithms", "dspark",
            "--anchor-widths", "4,8", "--anchor-batches", "3", "--out", str(out),
        ],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    anchors = json.loads((out / "probe.json").read_text())["algorithms"]["dspark"]["anchors"]
    assert anchors["widths"] == [4, 8]
    assert set(anchors["median_ms"]) == {"128x4", "128x8", "256x4", "256x8"}
    assert "anchor share of a step" in (out / "probe.md").read_text()
    # Static vs static + anchor buckets on low-supervision micro-batches, in the same process.
    check = json.loads((out / "probe.json").read_text())["algorithms"]["dspark"]["anchor_check"]
    assert check["micro_batches"] == 3
    assert set(check["widths"]) <= {4, 8}  # the toy preset's anchor buckets 4 / 8
    computed = check["computed_blocks"]
    assert computed["static"] == 3 * 2 * 8  # 3 micro-batches x 2 rows x num_anchors
    assert computed["anchor buckets"] == sum(2 * w for w in check["widths"])
    assert check["valid_blocks"] <= computed["anchor buckets"] <= computed["static"]
    # The floor: each micro-batch at its own largest count; the removable share is measured to it.
    assert check["valid_blocks"] <= computed["exact width"] <= computed["anchor buckets"]
    if computed["static"] > computed["exact width"]:
        assert check["removable_removed"] == pytest.approx(
            (computed["static"] - computed["anchor buckets"])
            / (computed["static"] - computed["exact width"])
        )
    assert "removable ones" in (out / "probe.md").read_text()
    assert check["expected_fall"] == pytest.approx(
        check["anchor_blocks_removed"] * anchors["anchor_share"]
    )
    assert "computed anchor blocks per valid anchor" in (out / "probe.md").read_text()


def _row(variant: str, *, ms: float, per_valid: float, workload: str = "low-supervision"):
    return RunResult(
        workload, "dspark", variant, status="ok", step_ms=ms, compute_ms_mean=ms,
        anchor_blocks_per_valid=per_valid,
    )  # fmt: skip


def test_anchor_check_counts_the_share_of_empty_blocks_removed():
    from shapebench.checks import anchor_checks

    rows = [
        _row("static", ms=200.0, per_valid=2.0),
        _row("static-anchors", ms=150.0, per_valid=1.08),
    ]
    (check,) = anchor_checks(rows)
    # 1.0 empty block per valid one before, 0.08 after: 92% of the empty blocks are gone.
    assert check.empty_removed == pytest.approx(0.92)
    assert check.met
    assert check.step_time_change == pytest.approx(-0.25)
    # No exact-width tally and no pad-to-longest row: the floor is 1.0, so every empty block
    # counts as removable.
    assert check.removable_removed == pytest.approx(0.92)
    assert "92.0% of the removable empty blocks removed" in check.describe()
    worse = anchor_checks([rows[0], _row("static-anchors", ms=190.0, per_valid=1.5)])[0]
    assert not worse.met and "missed by 40.0 pts" in worse.describe()


def test_low_supervision_target_is_within_ten_percent_of_pad_to_longest():
    from shapebench.checks import low_supervision_checks

    rows = [
        _row("fsdp2", ms=100.0, per_valid=1.2),
        _row("static", ms=250.0, per_valid=2.0),
        _row("static-anchors", ms=109.0, per_valid=1.3),
        _row("buckets-anchors", ms=125.0, per_valid=1.3),
    ]
    lines = low_supervision_checks(rows)
    assert len(lines) == 3
    assert "static vs fsdp2" in lines[0] and "+150.0%" in lines[0]
    assert "static-anchors vs fsdp2" in lines[1] and lines[1].endswith("met")
    assert lines[2].endswith("missed by 15.0 pts")


def test_removable_share_counts_only_what_a_width_can_remove():
    # Hand-built: num_anchors 64, two micro-batches of two rows; per-sample anchor counts
    # min(64, valid) = 10, 40 | 64, 64 (the 100 is capped).
    from shapebench.anchorcount import count_blocks
    from shapebench.checks import AnchorCheck, empty_share_removed, removable_share_removed

    counts, batches = [10, 40, 64, 100], [[0, 1], [2, 3]]
    static, valid = count_blocks(counts, batches, 64, (64,))
    exact, _ = count_blocks(counts, batches, 64, None)
    coarse, _ = count_blocks(counts, batches, 64, (16, 32, 64))
    fitted, _ = count_blocks(counts, batches, 64, (48, 64))
    assert (static, valid, exact, coarse, fitted) == (256, 178, 208, 256, 224)
    # 256 - 208 = 48 blocks are removable at all (the 10-anchor row rides with its 40-anchor
    # neighbour); widths 48 / 64 remove 32 of them, 16 / 32 / 64 none.
    assert removable_share_removed(static, fitted, exact) == pytest.approx(32 / 48)
    assert removable_share_removed(static, coarse, exact) == 0.0
    # Of all 256 - 178 = 78 empty blocks, 32 go.
    assert empty_share_removed(static / valid, fitted / valid) == pytest.approx(32 / 78)

    check = AnchorCheck(
        "low-supervision", "dspark", "static-anchors", "static", static / valid, fitted / valid,
        -0.1, exact / valid,
    )  # fmt: skip
    assert check.met is False
    line = check.describe()
    assert "66.7% of the removable empty blocks removed" in line
    assert "41.0% of all empty blocks" in line
    assert "missed by 23.3 pts" in line


def test_nothing_removable_is_not_reported_as_missed():
    # ShareGPT at the cpu preset: static, anchor buckets and the exact width all compute 1.046
    # blocks per valid anchor. Empty blocks exist, but no width removes any of them.
    from shapebench.checks import AnchorCheck

    check = AnchorCheck("sharegpt", "dspark", "static-anchors", "static", 1.046, 1.046, 0.3, 1.046)
    assert check.removable_removed is None and check.met is None
    assert check.describe().endswith("nothing to remove")
    assert "missed" not in check.describe()


def test_harness_check_takes_the_floor_from_the_exact_width_tally(tmp_path):
    import json as _json

    from shapebench.checks import anchor_checks
    from shapebench.results import steady_result

    # The child's bench.json carries the exact-width tally; steady_result reads it back.
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    metric = {
        "perf/train_compute_ms": 100.0, "perf/step_ms": 110.0, "perf/samples_per_s": 10.0,
        "perf/data_wait_ms": 1.0,
    }  # fmt: skip
    (run_dir / "metrics.jsonl").write_text(_json.dumps(metric) + "\n")
    tally = {"computed_anchor_blocks": 256, "valid_anchor_blocks": 178, "exact_anchor_blocks": 208}
    (run_dir / "bench.json").write_text(_json.dumps(tally))
    plain = steady_result(
        RunResult("low-supervision", "dspark", "static"), run_dir, steady=1, online=False
    )
    assert plain.exact_anchor_blocks_per_valid == pytest.approx(208 / 178)
    fitted = RunResult(
        "low-supervision", "dspark", "static-anchors", compute_ms_mean=90.0,
        anchor_blocks_per_valid=224 / 178, exact_anchor_blocks_per_valid=208 / 178,
    )  # fmt: skip
    # A pad-to-longest row with another floor is not used when the tally has one.
    longest = _row("fsdp2", ms=80.0, per_valid=1.0)
    (check,) = anchor_checks([longest, plain, fitted])
    assert check.removable_removed == pytest.approx(32 / 48)
    # Without the tally (rows from before it existed), the pad-to-longest row is the floor.
    plain.exact_anchor_blocks_per_valid = 0.0
    (old,) = anchor_checks([_row("fsdp2", ms=80.0, per_valid=208 / 178), plain, fitted])
    assert old.removable_removed == pytest.approx(32 / 48)


def test_an_anchor_grouped_run_is_judged_against_its_own_floor():
    from shapebench.checks import anchor_checks, low_supervision_checks

    # The plain run's random pairs leave 1.24 blocks per valid anchor even at the exact width;
    # the grouped run's own micro-batches get down to 1.01, and its buckets compute 1.05.
    plain = _row("static", ms=200.0, per_valid=1.66)
    plain.exact_anchor_blocks_per_valid = 1.24
    grouped = _row("static-anchors-grouped", ms=120.0, per_valid=1.05)
    grouped.exact_anchor_blocks_per_valid = 1.01
    (check,) = anchor_checks([plain, grouped])
    assert check.anchors == "static-anchors-grouped" and check.plain == "static"
    assert check.exact_blocks_per_valid == pytest.approx(1.01)
    assert check.removable_removed == pytest.approx(0.61 / 0.65)
    assert check.empty_removed == pytest.approx(0.61 / 0.66)
    assert check.met
    lines = low_supervision_checks([_row("fsdp2", ms=125.0, per_valid=1.2), grouped])
    assert lines == [
        "low-supervision / dspark: static-anchors-grouped vs fsdp2 (pad to longest): mean step "
        "time -4.0%; target (within 10% of pad-to-longest or faster): met"
    ]


def test_anchor_grouped_variants_set_the_data_field(tmp_path):
    from shapebench.presets import PRESETS, TargetFacts
    from shapebench.runner import BenchSettings, PlannedRun, run_config
    from shapebench.variants import BY_KEY

    from specdraft.config import validate_config

    settings = BenchSettings(
        preset=PRESETS["toy"], algorithms=("dspark",), variants=(BY_KEY["static"],),
        workloads=("low-supervision",), steps=1, steady=1, ranks=1, seed=0, work_dir=tmp_path,
    )  # fmt: skip
    target = TargetFacts("/nonexistent", (0, 1), 4096, 4096)
    for key, grouped in (("static-anchors-grouped", True), ("static-anchors", False)):
        run = PlannedRun("low-supervision", "dspark", BY_KEY[key], tmp_path / key)
        config = validate_config(run_config(settings, run, target))
        assert config.data.anchor_grouped is grouped
        assert config.training.static_anchor_buckets


def test_anchor_counts_meet_the_target_once_k_covers_every_count(tmp_path, capsys):
    # The counted tool on the toy preset: with K at least the number of distinct per-batch
    # counts, the exact DP reproduces the exact width, so 100% of the removable blocks go.
    import anchor_counts

    out = tmp_path / "counts"
    code = anchor_counts.main(
        ["--preset", "toy", "--workloads", "low-supervision", "--samples", "48",
         "--suggest", "1,64", "--out", str(out)]
    )  # fmt: skip
    assert code == 0
    rows = _json_rows(out / "counts.json", "low-supervision")
    for stack in ("static", "buckets"):
        by = {r["policy"]: r for r in rows if r["stack"] == stack}
        plain, exact = by["num_anchors"], by["exact width"]
        assert by["suggested anchor buckets (K = 1)"]["computed_blocks"] == plain["computed_blocks"]
        assert (
            by["suggested anchor buckets (K = 64)"]["computed_blocks"] == exact["computed_blocks"]
        )
        assert exact["valid_blocks"] <= exact["computed_blocks"] <= plain["computed_blocks"]
    longest = [r for r in rows if r["stack"] == "fsdp2"]
    assert longest[0]["computed_blocks"] == exact["computed_blocks"]  # same sampler, same floor
    # Anchor-grouped order: the DP still reaches its own floor, and on one pad length that floor
    # is never above the random order's (the sorted cut minimises the sum of widths).
    grouped = {r["policy"]: r for r in rows if r["stack"] == "static+grouped"}
    assert "num_anchors" not in grouped  # num_anchors blocks whatever the order
    floor = grouped["exact width"]["computed_blocks"]
    assert grouped["suggested anchor buckets (K = 64)"]["computed_blocks"] == floor
    static_exact = next(r for r in rows if r["stack"] == "static" and r["policy"] == "exact width")
    assert floor <= static_exact["computed_blocks"]
    text = (out / "counts.md").read_text()
    assert text == capsys.readouterr().out
    k64 = [line for line in text.splitlines() if "(K = 64)" in line and line.startswith("- ")]
    assert len(k64) == 4  # static and buckets, each in random and anchor-grouped order
    # The toy workload has removable blocks, so "met" is earned, not "nothing to remove".
    assert all("target (>= 90% of the removable): met;" in line for line in k64), k64
    assert all("100.0% of the removable empty blocks removed" in line for line in k64)
    assert all("as worded (>= 90% of all empty blocks): " in line for line in k64)


def _json_rows(path: Path, workload: str) -> list[dict]:
    return json.loads(path.read_text())["workloads"][workload]
