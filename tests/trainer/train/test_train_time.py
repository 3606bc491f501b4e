"""time/train_s: the seconds a run spent in optimizer steps, on every step's and eval's line.

Evaluation and checkpoint saves are made slow here (each sleeps SLOW seconds): the counter must
not see them, so runs with other eval or save intervals compare fairly on `specdraft curves`'
time axis. A run resumed from a checkpoint continues the checkpoint's count.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from train_support import one_rank, single_thread, tiny_run

from specdraft.config import validate_config
from specdraft.trainer.train.checkpoint import checkpoint_root, step_dir_name
from specdraft.trainer.train.metrics import TRAIN_CPU_KEY, TRAIN_TIME_KEY, read_metrics

SLOW = 0.5  # seconds each evaluation and each checkpoint save takes here
STEPS = 4


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


class SlowEvaluator:
    """An evaluator that takes SLOW seconds (a real one runs the draft on held-out prompts)."""

    def evaluate(self, model):
        time.sleep(SLOW)
        return {"tau": 1.0, "accept_rate_per_pos": [0.0]}


def slow_run(trainer):
    """Evaluate after every step and make every save SLOW seconds slower."""
    trainer.evaluator = SlowEvaluator()
    trainer.settings.eval_interval = 1
    save = trainer.save

    def slow_save():
        time.sleep(SLOW)
        return save()

    trainer.save = slow_save
    return trainer


def fit(config, **kwargs):
    """Build the trainer (kwargs: resume=), slow down its eval and saves, fit; the trainer."""
    from specdraft.trainer.train.assembly import build_trainer

    with one_rank() as ctx:
        trainer = slow_run(build_trainer(config, ctx, progress=False, **kwargs))
        resumed_at = trainer.train_seconds
        trainer.fit()
        trainer.writer.close()
    return trainer, resumed_at


@pytest.fixture(scope="module")
def run(tiny_target_path, tmp_path_factory):
    """A four-step run with a checkpoint every two steps: (config, metrics lines)."""
    out = tmp_path_factory.mktemp("train-time") / "run"
    settings = tiny_run(
        tiny_target_path, out, training={"max_steps": STEPS, "save_interval": 2, "log_interval": 1}
    )
    config = validate_config(settings)
    fit(config)
    return config, read_metrics(out / "metrics.jsonl")


def test_every_step_and_eval_line_carries_the_training_time_so_far(run):
    _, lines = run
    steps = {line["step"]: line for line in lines if "loss" in line}
    evals = {line["step"]: line for line in lines if "eval/tau" in line}
    assert sorted(steps) == list(range(1, STEPS + 1))
    assert sorted(evals) == list(range(STEPS + 1))
    assert evals[0][TRAIN_TIME_KEY] == 0.0  # the baseline evaluation, before any step
    times = [steps[s][TRAIN_TIME_KEY] for s in range(1, STEPS + 1)]
    assert times == sorted(times) and times[0] > 0
    for step in range(1, STEPS + 1):
        # An evaluation happens after its step's training: the same count on both lines.
        assert evals[step][TRAIN_TIME_KEY] == steps[step][TRAIN_TIME_KEY]


def test_the_training_time_leaves_out_evaluation_and_saves(run):
    _, lines = run
    steps = {line["step"]: line for line in lines if "loss" in line}
    before = 0.0
    for step in range(1, STEPS + 1):
        line = steps[step]
        spent = line[TRAIN_TIME_KEY] - before
        measured = (line["perf/train_compute_ms"] + line["perf/data_wait_ms"]) / 1e3
        # The step's own compute and data wait are in it; the SLOW evaluation (every step)
        # and save (step 2) before it are not.
        assert measured <= spent < measured + SLOW / 2, (step, spent, measured)
        before = line[TRAIN_TIME_KEY]
    # The wall clock did pass them: five evaluations and two saves of SLOW seconds.
    wall = lines[-1]["time"] - lines[0]["time"]
    assert wall >= steps[STEPS][TRAIN_TIME_KEY] + 5 * SLOW


def test_a_resumed_run_continues_the_checkpoints_count(run):
    config, lines = run
    checkpoint = checkpoint_root(Path(config.output_dir)) / step_dir_name(2)
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    logged = next(line for line in lines if line["step"] == 2 and "loss" in line)
    assert state["train_seconds"] == logged[TRAIN_TIME_KEY]

    trainer, resumed_at = fit(config, resume=str(checkpoint))
    assert resumed_at == state["train_seconds"]
    again = read_metrics(Path(config.output_dir) / "metrics.jsonl")
    # The resume dropped the first run's lines after step 2 and logged steps 3 and 4 again,
    # counting on from the checkpoint's time.
    step_lines = [line for line in again if "loss" in line]
    assert [line["step"] for line in step_lines] == list(range(1, STEPS + 1))
    times = [line[TRAIN_TIME_KEY] for line in step_lines]
    assert times == sorted(times)
    assert times[2] > state["train_seconds"]
    assert trainer.train_seconds == times[-1]


def test_the_cpu_clock_counts_the_same_intervals_in_process_cpu_time(run):
    config, lines = run
    steps = {line["step"]: line for line in lines if "loss" in line}
    evals = {line["step"]: line for line in lines if "eval/tau" in line}
    assert evals[0][TRAIN_CPU_KEY] == 0.0
    cpu = [steps[s][TRAIN_CPU_KEY] for s in range(1, STEPS + 1)]
    assert cpu == sorted(cpu) and cpu[0] > 0
    for step in range(1, STEPS + 1):
        assert evals[step][TRAIN_CPU_KEY] == steps[step][TRAIN_CPU_KEY]
    # The SLOW evaluations sleep: wall time passes, CPU time does not, and neither clock has
    # them; the steps' own CPU time is at most their wall time times the threads (one here).
    assert steps[STEPS][TRAIN_CPU_KEY] < steps[STEPS][TRAIN_TIME_KEY] * 1.5 + 0.5
    checkpoint = checkpoint_root(Path(config.output_dir)) / step_dir_name(2)
    state = json.loads((checkpoint / "trainer_state.json").read_text())
    assert state["train_cpu_seconds"] == steps[2][TRAIN_CPU_KEY]
