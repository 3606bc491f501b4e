"""The curves report: the table's numbers are the metrics', the reach lines and the side-by-side
ratios say what the runs did, the JSON holds the parsed curves, and the figure has one line per
run and panel at the evaluated steps and training times."""

from __future__ import annotations

import re

import pytest

from specdraft.trainer.curves.read import read_curve
from specdraft.trainer.curves.table import curves_json, format_seconds, render_text

ROW = re.compile(r"^\s+(\d+)\s+([\d.]+|-)\s+([\d.]+)$")


def two_runs(write_run):
    """Run a reaches tau 1.3 at 6 s (step 15); run b at 3 s (step 30): half the time."""
    a = write_run(
        "a",
        [(0, 0.0, 1.0, [0.0, 0.0]), (10, 4.0, 1.2, [0.2, 0.05]), (20, 8.0, 1.4, [0.3, 0.1])],
        final_step=20,
        seconds_per_step=0.4,
    )
    b = write_run(
        "b",
        [(0, 0.0, 1.0, [0.0, 0.0]), (20, 2.0, 1.2, [0.2, 0.0]), (40, 4.0, 1.4, [0.35, 0.125])],
        final_step=40,
        seconds_per_step=0.1,
    )
    return read_curve(a, "a"), read_curve(b, "b")


def table_rows(text: str, label: str) -> list[tuple[int, str, float]]:
    """The (step, train_s, tau) rows of one run's block of the text report."""
    block = next(b for b in text.split("\n\n") if b.startswith(f"{label}  "))
    rows = []
    for line in block.splitlines():
        match = ROW.match(line)
        if match:
            rows.append((int(match[1]), match[2], float(match[3])))
    return rows


def test_the_table_holds_each_evaluation_of_each_run(write_run):
    a, b = two_runs(write_run)
    text = render_text([a, b])
    assert table_rows(text, "a") == [(0, "0.00", 1.0), (10, "4.00", 1.2), (20, "8.00", 1.4)]
    assert table_rows(text, "b") == [(0, "0.00", 1.0), (20, "2.00", 1.2), (40, "4.00", 1.4)]
    assert "20 steps, 8.00 s of training, 3 evaluations" in text
    assert "40 steps, 4.00 s of training, 3 evaluations" in text
    # Per-position acceptance of the last evaluation of each run.
    assert "accept rate per position at step 20: 0.300 0.100" in text
    assert "accept rate per position at step 40: 0.350 0.125" in text
    assert "tau first 1.0000 (step 0), last 1.4000 (step 20), best 1.4000 (step 20, 8.00 s)" in text
    assert "evaluation and checkpoint saves excluded" in text


def test_reach_lines_and_the_side_by_side_ratio(write_run):
    a, b = two_runs(write_run)
    text = render_text([a, b], [1.3, 1.5])
    assert (
        "tau 1.3: reached at 6.00 s of training, step 15 "
        "(interpolated between the evals at 10 and 20)"
    ) in text
    assert "tau 1.3: reached at 3.00 s of training, step 30" in text
    assert "tau 1.5: not reached (best 1.4000)" in text
    comparison = text.split("training time to reach tau 1.3 (ratio to a):\n")[1]
    assert re.search(r"^  a\s+6\.00 s\s+step 15\s+1\.00x$", comparison, re.M)
    assert re.search(r"^  b\s+3\.00 s\s+step 30\s+0\.50x$", comparison, re.M)
    assert re.search(r"^  a\s+not reached$", text.split("reach tau 1.5")[1], re.M)


def test_a_short_run_is_told_it_is_not_a_curve(write_run):
    run = read_curve(write_run("two", [(0, 0.0, 1.0, [0.0]), (8, 1.0, 1.1, [0.1])]))
    assert "only 2 evaluations, not a curve" in render_text([run])
    assert "training.eval_interval" in render_text([run])


def test_json_holds_the_parsed_curves(write_run):
    a, b = two_runs(write_run)
    report = curves_json([a, b], [1.3], plot="c.png")
    assert report["plot"] == "c.png"
    run_a = report["runs"][0]
    assert run_a["label"] == "a" and run_a["final_step"] == 20 and run_a["train_s"] == 8.0
    assert run_a["evals"][1] == {
        "step": 10,
        "train_s": 4.0,
        "tau": 1.2,
        "accept_rate_per_pos": [0.2, 0.05],
        "steps": 40.0,
        "capped_prompts": 0,
    }
    assert run_a["reach"] == [
        {
            "tau": 1.3,
            "reached": True,
            "step": pytest.approx(15.0),
            "train_s": pytest.approx(6.0),
            "interpolated_between": [10, 20],
        }
    ]
    assert run_a["summary"]["best"] == {"step": 20, "tau": 1.4, "train_s": 8.0}


def test_long_times_say_minutes_or_hours():
    assert format_seconds(12.345) == "12.35 s"
    assert format_seconds(600) == "600.00 s (10.0 min)"
    assert format_seconds(3 * 3600) == "10800.00 s (3.0 h)"
    assert format_seconds(None) == "-"


# ---------------------------------------------------------------------------------- plot


@pytest.fixture
def plot():
    pytest.importorskip("matplotlib")  # the [plot] extra
    from specdraft.trainer.curves import plot

    return plot


def test_the_figure_has_a_line_per_run_in_each_panel(write_run, plot):
    a, b = two_runs(write_run)
    figure = plot.curves_figure([a, b])
    step_axes, time_axes = figure.axes
    assert step_axes.get_xlabel() == "optimizer step"
    assert time_axes.get_xlabel().startswith("training time (s;")
    for axes in (step_axes, time_axes):
        assert [line.get_label() for line in axes.get_lines()] == ["a", "b"]
        assert all(line.get_marker() == "o" for line in axes.get_lines())
        assert [list(line.get_ydata()) for line in axes.get_lines()] == [
            [1.0, 1.2, 1.4],
            [1.0, 1.2, 1.4],
        ]
    assert [list(line.get_xdata()) for line in step_axes.get_lines()] == [[0, 10, 20], [0, 20, 40]]
    assert [list(line.get_xdata()) for line in time_axes.get_lines()] == [
        [0.0, 4.0, 8.0],
        [0.0, 2.0, 4.0],
    ]


def test_one_axis_and_long_runs_in_hours(write_run, plot):
    run = read_curve(write_run("long", [(0, 0.0, 1.0, [0]), (1000, 3 * 3600.0, 1.2, [0.2])]))
    (only,) = plot.curves_figure([run], "step").axes
    assert only.get_xlabel() == "optimizer step"
    (hours,) = plot.curves_figure([run], "time").axes
    assert hours.get_xlabel().startswith("training time (h;")
    assert list(hours.get_lines()[0].get_xdata()) == [0.0, 3.0]


def test_runs_without_training_time_are_left_out_of_the_time_panel(write_run, plot):
    timed = read_curve(write_run("new", [(0, 0.0, 1.0, [0]), (10, 2.0, 1.1, [0.1])]))
    old = read_curve(write_run("old", [(0, None, 1.0, [0]), (10, None, 1.1, [0.1])]))
    step_axes, time_axes = plot.curves_figure([timed, old]).axes
    assert [line.get_label() for line in step_axes.get_lines()] == ["new", "old"]
    assert [line.get_label() for line in time_axes.get_lines()] == ["new"]
    with pytest.raises(ValueError, match="--x step"):
        plot.curves_figure([old], "time")


def test_the_png_is_written(write_run, plot, tmp_path):
    a, b = two_runs(write_run)
    out = tmp_path / "curves.png"
    figure = plot.save_curves_plot([a, b], out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out.stat().st_size > 10_000  # two panels of lines, not an empty canvas
    assert len(figure.axes) == 2
