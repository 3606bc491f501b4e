"""A run's metrics.jsonl read back as a curve (one point per evaluation), and what a curve is
judged by: first/last/best tau and the training time at which it first reaches a tau."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from specdraft.trainer.curves.read import TRAIN_TIME_KEY, CurveError, read_curve
from specdraft.trainer.curves.summary import reach, tau_summary

RATES = [0.5, 0.25, 0.1]


def test_eval_lines_become_points_and_train_lines_only_set_the_end(write_run):
    run = write_run(
        "run-a",
        [(0, 0.0, 1.0, [0, 0, 0]), (10, 4.0, 1.2, RATES), (20, 8.5, 1.4, [0.6, 0.3, 0.2])],
        final_step=25,
        seconds_per_step=0.5,
    )
    curve = read_curve(run, "a")
    assert curve.label == "a" and curve.path == run / "metrics.jsonl"
    assert [(p.step, p.train_s, p.tau) for p in curve.points] == [
        (0, 0.0, 1.0),
        (10, 4.0, 1.2),
        (20, 8.5, 1.4),
    ]
    assert curve.points[1].accept_rate_per_pos == RATES
    assert curve.points[1].metrics["steps"] == 40.0  # every eval/ key kept, prefix dropped
    assert (curve.final_step, curve.train_s) == (25, 12.5)
    assert curve.timed and not curve.torn_tail


def test_a_metrics_file_itself_is_read_and_named_after_its_folder(write_run):
    run = write_run("run-b", [(0, 0.0, 1.0, RATES), (5, 1.0, 1.1, RATES)])
    assert read_curve(run / "metrics.jsonl").label == "run-b"
    assert read_curve(run).label == "run-b"


def test_a_torn_last_line_is_skipped_and_reported(write_run):
    # A run killed while writing: the last line stops mid-object.
    run = write_run("killed", [(0, 0.0, 1.0, RATES), (4, 2.0, 1.1, RATES)], tail='{"step": 5, "lo')
    curve = read_curve(run)
    assert curve.torn_tail
    assert [p.step for p in curve.points] == [0, 4]
    assert curve.final_step == 4


def test_a_damaged_line_inside_the_file_is_named(write_run):
    run = write_run("damaged", [(0, 0.0, 1.0, RATES)])
    path = run / "metrics.jsonl"
    path.write_text(path.read_text() + "garbage\n" + json.dumps({"step": 1, "loss": 1.0}) + "\n")
    with pytest.raises(CurveError, match=rf"{path}:2: not a JSON line"):
        read_curve(run)


def test_a_step_evaluated_twice_keeps_the_resumed_runs_line(write_run):
    # Lines a resume could not drop: the step-4 eval is logged again by the resumed run.
    run = write_run(
        "resumed",
        [(0, 0.0, 1.0, RATES), (4, 2.0, 1.1, RATES), (4, 2.0, 1.15, RATES), (8, 4.0, 1.2, RATES)],
    )
    curve = read_curve(run)
    assert [(p.step, p.tau) for p in curve.points] == [(0, 1.0), (4, 1.15), (8, 1.2)]


def test_a_folder_without_metrics_names_itself(tmp_path):
    with pytest.raises(CurveError, match=rf"{tmp_path / 'nowhere'}: no metrics.jsonl here"):
        read_curve(tmp_path / "nowhere")


def test_a_run_without_evaluations_names_the_fix(tmp_path):
    run = tmp_path / "no-eval"
    run.mkdir()
    lines = [{"step": s, "loss": 5.0, TRAIN_TIME_KEY: s * 0.1} for s in (1, 2, 3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(CurveError) as err:
        read_curve(run)
    message = str(err.value)
    assert str(run / "metrics.jsonl") in message
    assert "no held-out evaluation" in message
    assert "--set training.eval_interval=N" in message and "data.eval_paths" in message


def test_runs_of_older_versions_have_steps_but_no_time(write_run):
    run = write_run("old", [(0, None, 1.0, RATES), (10, None, 1.2, RATES)])
    curve = read_curve(run)
    assert not curve.timed and curve.train_s is None
    assert [p.step for p in curve.points] == [0, 10]
    result = reach(curve, 1.1)
    assert result.step == pytest.approx(5.0) and result.train_s is None


def test_the_key_is_the_one_the_trainer_writes():
    from specdraft.trainer.curves.read import CLOCK_KEYS
    from specdraft.trainer.train.metrics import TRAIN_CPU_KEY
    from specdraft.trainer.train.metrics import TRAIN_TIME_KEY as WRITTEN

    assert TRAIN_TIME_KEY == WRITTEN
    assert CLOCK_KEYS == {"wall": WRITTEN, "cpu": TRAIN_CPU_KEY}


def test_the_cpu_clock_reads_the_cpu_seconds(tmp_path):
    from specdraft.trainer.curves.read import TRAIN_CPU_KEY

    lines = [
        {"step": s, "eval/tau": 1.0 + s / 10, TRAIN_TIME_KEY: s * 2.0, TRAIN_CPU_KEY: s * 1.0}
        for s in (0, 1, 2)
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    wall, cpu = read_curve(tmp_path), read_curve(tmp_path, clock="cpu")
    assert [p.train_s for p in wall.points] == [0.0, 2.0, 4.0]
    assert [p.train_s for p in cpu.points] == [0.0, 1.0, 2.0] and cpu.train_s == 2.0


@pytest.mark.subprocess
def test_reading_a_curve_imports_no_torch(write_run):
    # The command must start fast: nothing on the reading path may pull torch in.
    run = write_run("fast", [(0, 0.0, 1.0, RATES)])
    code = (
        "import sys; from specdraft.trainer.curves.read import read_curve; "
        "from specdraft.trainer.curves.table import render_text; "
        f"render_text([read_curve(__import__('pathlib').Path({str(run)!r}))]); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


# ------------------------------------------------------------------------- reach and summary


def curve_of(write_run, name, points):
    """A curve of (step, train_s, tau) points."""
    return read_curve(write_run(name, [(s, t, tau, RATES) for s, t, tau in points]))


def test_reach_interpolates_step_and_time_between_evaluations(write_run):
    curve = curve_of(write_run, "r", [(0, 0.0, 1.0), (10, 4.0, 1.2), (20, 8.0, 1.4)])
    result = reach(curve, 1.3)
    assert result.reached
    assert result.step == pytest.approx(15.0) and result.train_s == pytest.approx(6.0)
    assert result.between == (10, 20)
    exact = reach(curve, 1.2)  # an evaluation met it: no interpolation
    assert (exact.step, exact.train_s, exact.between) == (10.0, 4.0, None)
    first = reach(curve, 0.9)  # already there at the first evaluation
    assert (first.step, first.train_s) == (0.0, 0.0)
    never = reach(curve, 1.5)
    assert not never.reached and never.step is None and never.train_s is None


def test_reach_is_the_first_crossing_even_after_a_dip(write_run):
    curve = curve_of(
        write_run, "dip", [(0, 0.0, 1.0), (10, 5.0, 1.3), (20, 10.0, 1.1), (30, 15.0, 1.4)]
    )
    early = reach(curve, 1.25)
    assert early.between == (0, 10) and early.step == pytest.approx(25 / 3)
    late = reach(curve, 1.35)
    assert late.between == (20, 30)
    assert late.step == pytest.approx(20 + 10 * 0.25 / 0.3)
    assert late.train_s == pytest.approx(10 + 5 * 0.25 / 0.3)


def test_summary_is_first_last_and_earliest_best(write_run):
    curve = curve_of(
        write_run, "s", [(0, 0.0, 1.0), (10, 4.0, 1.3), (20, 8.0, 1.3), (30, 12.0, 1.2)]
    )
    summary = tau_summary(curve)
    assert summary["first"] == {"step": 0, "tau": 1.0, "train_s": 0.0}
    assert summary["last"] == {"step": 30, "tau": 1.2, "train_s": 12.0}
    assert summary["best"] == {"step": 10, "tau": 1.3, "train_s": 4.0}


def test_a_nan_tau_is_read_but_never_best_or_reached(write_run):
    # The JSONL writes non-finite floats as text.
    curve = curve_of(write_run, "nan", [(0, 0.0, 1.0), (10, 4.0, "nan"), (20, 8.0, 1.2)])
    assert math.isnan(curve.points[1].tau)
    assert tau_summary(curve)["best"]["step"] == 20
    assert reach(curve, 1.1).between == (0, 20)


@given(
    rates=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=15),
    tokens=st.integers(1, 16),
)
def test_served_at_is_the_acceptance_of_the_first_positions(tmp_path_factory, rates, tokens):
    # 1 + the chance that positions 1..k all survive, summed over k <= tokens: never more than
    # the whole block's, never less than 1, one more position never lowers it.
    folder = tmp_path_factory.mktemp("run")
    line = {"step": 4, "eval/tau": 99.0, "eval/accept_rate_per_pos": rates}
    (folder / "metrics.jsonl").write_text(json.dumps(line) + "\n")
    curve = read_curve(folder)
    point = curve.served_at(tokens).points[0]
    survive, expected = 1.0, 1.0
    for rate in rates[:tokens]:
        survive *= rate
        expected += survive
    if tokens < len(rates):
        assert point.tau == pytest.approx(expected)
        assert point.accept_rate_per_pos == rates[:tokens]
        assert curve.served_at(tokens + 1).points[0].tau >= point.tau - 1e-12
        assert 1.0 <= point.tau <= 1.0 + tokens
    else:  # a block no longer than the setting is served whole: its measured tau stays
        assert point.tau == 99.0 and point.accept_rate_per_pos == rates
    assert curve.points[0].tau == 99.0  # the curve itself is left as it was read
