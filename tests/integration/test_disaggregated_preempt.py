"""A managed disaggregated run preempted with SIGTERM (as a cluster does) saves at the next
optimizer step and exits 75; `--resume latest` finishes it with each sample trained once per
epoch by the producer's ledger, an empty store, and the weights of a run never stopped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from disagg_runs import (
    EXAMPLE,
    ROOT,
    RUN_TIMEOUT_S,
    SPECDRAFT,
    read_steps,
    run_settings,
    service_logs,
    session_data,
    train,
)
from test_disaggregated_crash_resume import LONG, assert_trained_once_like_an_uninterrupted_run

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(1500)]

STOPPED_EXIT = 75


def steps_logged(run_dir) -> int:
    return len(read_steps(run_dir)) if (run_dir / "metrics.jsonl").is_file() else 0


def test_sigterm_saves_and_the_resumed_run_trains_each_sample_once(tmp_path_factory):
    data = session_data(tmp_path_factory)
    run_dir = tmp_path_factory.mktemp("preempted") / "run"
    argv = [*SPECDRAFT, "train", str(EXAMPLE), "--no-progress"]
    for item in (*run_settings(run_dir, data), *LONG):
        argv += ["--set", item]
    launcher = subprocess.Popen(
        argv,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline = time.monotonic() + RUN_TIMEOUT_S
    while steps_logged(run_dir) < 2:
        assert launcher.poll() is None, launcher.stderr.read()[-4000:]
        assert time.monotonic() < deadline, "no second step in time"
        time.sleep(0.1)
    os.kill(launcher.pid, signal.SIGTERM)
    _, stderr = launcher.communicate(timeout=RUN_TIMEOUT_S)
    assert launcher.returncode == STOPPED_EXIT, f"{stderr[-4000:]}\n{service_logs(run_dir)}"
    assert "Traceback" not in stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped"] == "signal" and summary["final_step"] < 10
    # The step it stopped at is saved: the resume loses nothing.
    assert summary["checkpoint"].endswith(f"step-{summary['final_step']:07d}")
    assert "services stopped" in stderr

    train(run_dir, data, LONG, resume="latest")
    assert_trained_once_like_an_uninterrupted_run(run_dir, data, tmp_path_factory)
