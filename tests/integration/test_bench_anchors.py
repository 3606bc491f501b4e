"""The benchmark's anchor dimension (issue 13): anchor-bucket rows, the anchor-block tally, and
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
            "--anchor-widths", "4,8", "--out", str(out),
        ],
        capture_output=True, text=True, timeout=900, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    anchors = json.loads((out / "probe.json").read_text())["algorithms"]["dspark"]["anchors"]
    assert anchors["widths"] == [4, 8]
    assert set(anchors["median_ms"]) == {"128x4", "128x8", "256x4", "256x8"}
    assert "anchor share of a step" in (out / "probe.md").read_text()
