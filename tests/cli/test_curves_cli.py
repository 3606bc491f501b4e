"""`specdraft curves RUN_DIR...`: held-out tau of runs against step and training time.

Hand-written metrics files check the table, --reach, --label, --format json, --out and the
refusals (exit 2, naming the folder and the fix); one real `specdraft train` run with an
evaluation every two steps checks that what the command prints is what the run measured.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cli_support import specdraft_cli
from click.testing import CliRunner
from train_support import tiny_run, write_config

from specdraft.cli.main import cli


def write_metrics(folder: Path, evals, *, tail: str = "") -> Path:
    """A run folder whose metrics.jsonl has, per (step, train_s, tau, rates), the step's train
    line (after step 0) and its eval line, in the trainer's order, then raw `tail` text."""
    folder.mkdir(parents=True)
    lines = []
    for step, train_s, tau, rates in evals:
        if step:
            lines.append({"step": step, "loss": 4.0, "time/train_s": train_s})
        lines.append(
            {
                "step": step,
                "eval/tau": tau,
                "eval/accept_rate_per_pos": rates,
                "time/train_s": train_s,
            }
        )
    text = "".join(json.dumps(line) + "\n" for line in lines) + tail
    (folder / "metrics.jsonl").write_text(text)
    return folder


@pytest.fixture
def runs(tmp_path):
    """Two runs: `fast` reaches tau 1.3 in half the training time of `slow`."""
    slow = write_metrics(
        tmp_path / "slow",
        [(0, 0.0, 1.0, [0.0, 0.0]), (10, 4.0, 1.2, [0.2, 0.0]), (20, 8.0, 1.4, [0.4, 0.1])],
    )
    fast = write_metrics(
        tmp_path / "fast",
        [(0, 0.0, 1.0, [0.0, 0.0]), (10, 2.0, 1.2, [0.2, 0.0]), (20, 4.0, 1.4, [0.45, 0.2])],
        tail='{"step": 21, "lo',  # killed while writing its last line
    )
    return slow, fast


def invoke(*args: str):
    """`specdraft ARGS` in-process."""
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_the_table_compares_runs_at_equal_training_time(runs):
    slow, fast = runs
    done = invoke("curves", slow, fast, "--reach", "1.3")
    assert done.exit_code == 0, done.output
    out = done.stdout
    assert f"slow  {slow / 'metrics.jsonl'}" in out and f"fast  {fast / 'metrics.jsonl'}" in out
    assert re.search(r"^\s+10\s+4\.00\s+1\.2000$", out, re.M)  # slow's step-10 evaluation
    assert re.search(r"^\s+10\s+2\.00\s+1\.2000$", out, re.M)  # fast's
    assert "accept rate per position at step 20: 0.450 0.200" in out
    assert "its last line was cut off" in out  # fast was killed mid-write: read all the same
    assert "tau 1.3: reached at 6.00 s of training, step 15" in out
    assert "tau 1.3: reached at 3.00 s of training, step 15" in out
    assert re.search(r"^  fast\s+3\.00 s\s+step 15\s+0\.50x$", out, re.M)


def test_labels_name_the_runs_in_order(runs):
    slow, fast = runs
    done = invoke("curves", slow, fast, "--label", "recipe-A", "--label", "recipe-B")
    assert done.exit_code == 0, done.output
    assert done.stdout.startswith(f"recipe-A  {slow / 'metrics.jsonl'}")
    assert f"recipe-B  {fast / 'metrics.jsonl'}" in done.stdout
    wrong = invoke("curves", slow, fast, "--label", "only-one")
    assert wrong.exit_code == 2
    assert "1 --label for 2 runs" in wrong.stderr


def test_json_prints_the_parsed_curves(runs):
    slow, fast = runs
    done = invoke("curves", slow, fast, "--format", "json", "--reach", "1.3")
    assert done.exit_code == 0, done.output
    report = json.loads(done.stdout)
    assert [run["label"] for run in report["runs"]] == ["slow", "fast"]
    assert [(e["step"], e["train_s"], e["tau"]) for e in report["runs"][1]["evals"]] == [
        (0, 0.0, 1.0),
        (10, 2.0, 1.2),
        (20, 4.0, 1.4),
    ]
    assert report["runs"][1]["evals"][-1]["accept_rate_per_pos"] == [0.45, 0.2]
    assert report["runs"][1]["torn_last_line"] is True
    assert report["runs"][0]["reach"][0]["train_s"] == pytest.approx(6.0)
    assert report["plot"] is None


def test_out_draws_one_line_per_run_into_a_png(runs, tmp_path):
    pytest.importorskip("matplotlib")  # the trainer's [plot] extra
    slow, fast = runs
    png = tmp_path / "curves.png"
    done = invoke("curves", slow, fast, "--out", png, "--x", "step")
    assert done.exit_code == 0, done.output
    assert f"plot written to {png}" in done.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    both = tmp_path / "both.png"
    assert invoke("curves", slow, fast, "--out", both).exit_code == 0
    # Two panels side by side: twice as wide as the step panel alone.
    from PIL import Image

    assert Image.open(both).width > 1.8 * Image.open(png).width


def test_tokens_compares_a_long_block_with_a_short_one_as_each_would_be_served(tmp_path):
    # A block-8 draft (7 rates) and a block-4 draft (3 rates): at 3 speculative tokens a step
    # the long block accepts only its first three positions, 1 + .5 + .5*.4 + .5*.4*.5 = 1.8,
    # and the short block's tau stays what it measured.
    long = write_metrics(
        tmp_path / "block8",
        [(0, 0.0, 1.0, [0.0] * 7), (10, 5.0, 1.9, [0.5, 0.4, 0.5, 0.5, 0.5, 0.5, 0.5])],
    )
    short = write_metrics(
        tmp_path / "block4", [(0, 0.0, 1.0, [0.0] * 3), (10, 4.0, 1.85, [0.6, 0.5, 0.3])]
    )
    done = invoke("curves", long, short, "--tokens", "3", "--reach", "1.82")
    assert done.exit_code == 0, done.output
    assert re.search(r"^\s+10\s+5\.00\s+1\.8000$", done.stdout, re.M)
    assert "accept rate per position at step 10: 0.500 0.400 0.500\n" in done.stdout
    assert re.search(r"^\s+10\s+4\.00\s+1\.8500$", done.stdout, re.M)
    assert "tau 1.82: not reached (best 1.8000)" in done.stdout
    assert "served with 3 speculative tokens a step" in done.stdout
    whole = json.loads(invoke("curves", long, "--format", "json").stdout)
    assert whole["runs"][0]["evals"][-1]["tau"] == 1.9  # without --tokens: the whole block
    assert whole["speculative_tokens"] is None
    cut = json.loads(invoke("curves", long, "--tokens", "3", "--format", "json").stdout)
    assert cut["runs"][0]["evals"][-1]["tau"] == pytest.approx(1.8)
    assert cut["speculative_tokens"] == 3
    refused = invoke("curves", long, "--tokens", "0")
    assert refused.exit_code == 2 and "--tokens" in refused.stderr


def test_a_folder_without_metrics_is_refused_naming_it(runs, tmp_path):
    slow, _ = runs
    missing = tmp_path / "not-a-run"
    missing.mkdir()
    done = invoke("curves", slow, missing)
    assert done.exit_code == 2
    assert f"curves: {missing}: no metrics.jsonl here" in done.stderr
    assert "Traceback" not in done.output


def test_a_run_without_evaluations_is_refused_naming_the_fix(tmp_path):
    run = tmp_path / "no-eval"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 4.0}) + "\n")
    done = invoke("curves", run)
    assert done.exit_code == 2
    assert f"{run / 'metrics.jsonl'}: no held-out evaluation in this run" in done.stderr
    assert "--set training.eval_interval=N" in done.stderr


def test_curves_is_listed_in_the_help():
    done = invoke("--help")
    assert re.search(r"^  curves\s+Learning curves", done.output, re.M)


# ------------------------------------------------------------------------------ a real run


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_real_run_prints_the_tau_it_measured_at_each_evaluation(tiny_target_path, tmp_path):
    """Four steps on the tiny target, evaluated at steps 0, 2 and 4 on two held-out prompts."""
    out = tmp_path / "run"
    config = write_config(
        tmp_path / "run.toml",
        tiny_run(
            tiny_target_path,
            out,
            data={"eval_paths": ["pkg:sharegpt"], "max_eval_samples": 2},
            training={"max_steps": 4, "eval_interval": 2, "log_interval": 1},
        ),
    )
    trained = specdraft_cli("train", str(config), "--no-progress", cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr[-3000:]
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [line for line in lines if "eval/tau" in line]
    summary = json.loads((out / "summary.json").read_text())
    assert [e["step"] for e in evals] == [e["step"] for e in summary["evals"]] == [0, 2, 4]

    done = specdraft_cli("curves", str(out), "--format", "json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (run,) = json.loads(done.stdout)["runs"]
    assert [e["tau"] for e in run["evals"]] == [e["tau"] for e in summary["evals"]]
    assert [e["train_s"] for e in run["evals"]] == [e["time/train_s"] for e in evals]
    assert run["evals"][-1]["accept_rate_per_pos"] == summary["evals"][-1]["accept_rate_per_pos"]
    assert run["final_step"] == 4
    times = [e["train_s"] for e in run["evals"]]
    assert times[0] == 0.0 and times[0] < times[1] < times[2]
    # An evaluation's line is written after it ran (later wall time) with its step's training
    # time unchanged: the evaluation is not training time.
    for e in evals[1:]:
        (step_line,) = [x for x in lines if x["step"] == e["step"] and "loss" in x]
        assert e["time"] > step_line["time"]
        assert e["time/train_s"] == step_line["time/train_s"]

    text = CliRunner().invoke(cli, ["curves", str(out)])
    assert text.exit_code == 0, text.output
    for e in evals:
        row = f"{e['step']:>8}  {e['time/train_s']:>10.2f}  {e['eval/tau']:>7.4f}"
        assert row in text.stdout
