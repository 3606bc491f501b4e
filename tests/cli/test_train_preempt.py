"""SIGTERM / Ctrl-C stop a run at the next optimizer step with a checkpoint, on one process and
under the built-in launcher (2 gloo ranks), exit 75 (stopped, resumable) without a traceback, and
`--resume latest` then ends with the same weights, bit for bit, as an uninterrupted run. A second
signal, or the --stop-timeout deadline, stops at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from train_support import DIST_ENV, tiny_run, write_config

STOPPED_EXIT = 75
# 80 samples, micro-batch 2, accumulation 2: 20 steps on one rank, 10 on two.
SETTINGS = {
    "data": {"max_samples": 80},
    "training": {"grad_accum_steps": 2, "max_steps": 100, "save_interval": 100},
}


def clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV}
    env["OMP_NUM_THREADS"] = "1"
    return env


def train_command(config: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "specdraft.cli", "train", str(config), "--no-progress", *extra]


def train(config: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        train_command(config, *extra), capture_output=True, text=True, env=clean_env(), timeout=300
    )


def interrupt(config: Path, run: Path, sig: int, *extra: str) -> tuple[int, str, float]:
    """Start a run, send `sig` once it has logged 2 steps; (exit code, stderr, seconds to stop)."""
    process = subprocess.Popen(
        train_command(config, *extra),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
        start_new_session=True,
    )
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):
        assert process.poll() is None, process.stderr.read()[-3000:]
        assert time.monotonic() < deadline, "no second step within 240 s"
        time.sleep(0.02)
    os.kill(process.pid, sig)
    sent = time.monotonic()
    _, stderr = process.communicate(timeout=150)
    return process.returncode, stderr, time.monotonic() - sent


def weights(run: Path) -> bytes:
    steps = sorted((run / "checkpoints").glob("step-*"))
    return (steps[-1] / "model.safetensors").read_bytes()


@pytest.mark.slow
def test_sigterm_under_the_launcher_stops_saved_and_resumes_to_the_same_weights(
    tiny_target_path, tmp_path
):
    whole = write_config(
        tmp_path / "whole.toml", tiny_run(tiny_target_path, tmp_path / "whole", **SETTINGS)
    )
    stopped = write_config(
        tmp_path / "stopped.toml", tiny_run(tiny_target_path, tmp_path / "stopped", **SETTINGS)
    )
    done = train(whole, "--nproc-per-node", "2")
    assert done.returncode == 0, done.stderr[-3000:]

    code, stderr, seconds = interrupt(
        stopped, tmp_path / "stopped", signal.SIGTERM, "--nproc-per-node", "2"
    )
    assert code == STOPPED_EXIT, stderr[-3000:]
    assert "Traceback" not in stderr and "SignalException" not in stderr
    assert "continue with --resume latest" in stderr
    saved = sorted((tmp_path / "stopped" / "checkpoints").glob("step-*"))
    assert len(saved) == 1 and saved[0].name != "step-0000010", saved  # stopped mid-run
    assert seconds < 60

    resumed = train(stopped, "--nproc-per-node", "2", "--resume", "latest")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resumed from {saved[0]}" in resumed.stderr
    assert weights(tmp_path / "stopped") == weights(tmp_path / "whole")


@pytest.mark.slow
def test_ctrl_c_on_one_process_saves_the_step_it_stopped_at(tiny_target_path, tmp_path):
    config = write_config(
        tmp_path / "run.toml", tiny_run(tiny_target_path, tmp_path / "run", **SETTINGS)
    )
    code, stderr, _ = interrupt(config, tmp_path / "run", signal.SIGINT)
    assert code == STOPPED_EXIT, stderr[-3000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    (saved,) = sorted((tmp_path / "run" / "checkpoints").glob("step-*"))
    step = int(saved.name.split("-")[1])
    # The checkpoint is the step the run stopped at: every step it logged, none after.
    from specdraft.trainer.train.metrics import read_metrics

    assert max(row["step"] for row in read_metrics(tmp_path / "run" / "metrics.jsonl")) == step
    resumed = train(config, "--resume", "latest")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert (tmp_path / "run" / "checkpoints" / "step-0000020").is_dir()


SLEEPER = textwrap.dedent(
    """
    import sys, time
    from specdraft.trainer.train.preempt import stop_on_signals, stop_requested
    with stop_on_signals(float(sys.argv[1])):
        print("ready", flush=True)
        while True:
            time.sleep(0.05)
            if stop_requested():
                print("requested", flush=True)
                time.sleep(60)  # a step that never ends: only a second signal or the deadline
    """
)


def start_sleeper(timeout: float) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, "-c", SLEEPER, str(timeout)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    assert process.stdout.readline().strip() == "ready"
    return process


@pytest.mark.subprocess
def test_a_second_signal_stops_at_once():
    process = start_sleeper(timeout=0)
    process.send_signal(signal.SIGTERM)
    assert process.stdout.readline().strip() == "requested"
    assert process.poll() is None  # the first signal only asks
    process.send_signal(signal.SIGINT)
    start = time.monotonic()
    process.wait(timeout=10)
    assert process.returncode == 128 + signal.SIGINT
    assert time.monotonic() - start < 5
    assert "stopped at once by SIGINT" in process.stderr.read()


@pytest.mark.subprocess
def test_the_launchers_forwarded_request_never_counts_as_a_second_signal():
    process = start_sleeper(timeout=0)
    process.send_signal(signal.SIGINT)  # Ctrl-C reaches the rank ...
    assert process.stdout.readline().strip() == "requested"
    process.send_signal(signal.SIGUSR1)  # ... and the launcher forwards it too
    time.sleep(0.5)
    assert process.poll() is None
    process.send_signal(signal.SIGUSR2)  # the launcher's hard stop
    process.wait(timeout=10)
    assert process.returncode == 128 + signal.SIGTERM


@pytest.mark.subprocess
def test_the_stop_timeout_bounds_a_stop_that_does_not_finish():
    process = start_sleeper(timeout=1.0)
    start = time.monotonic()
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=20)
    assert process.returncode == 128 + signal.SIGTERM
    assert 0.9 < time.monotonic() - start < 10
    assert "did not finish within 1 s" in process.stderr.read()


def test_the_cli_documents_the_exit_status_it_uses():
    from specdraft.cli import train_cmd
    from specdraft.trainer.train import preempt

    assert train_cmd.STOPPED_EXIT == preempt.STOPPED_EXIT == STOPPED_EXIT
    assert train_cmd.DEFAULT_STOP_TIMEOUT == preempt.DEFAULT_STOP_TIMEOUT
    from click.testing import CliRunner

    from specdraft.cli.main import cli

    text = CliRunner().invoke(cli, ["train", "--help"]).output
    assert "status 75" in " ".join(text.split()) and "--stop-timeout" in text


@pytest.mark.slow
def test_under_torchrun_the_ranks_save_the_step_torchrun_stops_them_at(tiny_target_path, tmp_path):
    """torchrun forwards SIGTERM to its ranks (and gives them its own 30 s): they save."""
    run = tmp_path / "run"
    config = write_config(tmp_path / "run.toml", tiny_run(tiny_target_path, run, **SETTINGS))
    torchrun = Path(sys.executable).with_name("torchrun")
    command = [str(torchrun), "--nproc-per-node", "2", "-m", "specdraft.cli", "train"]
    command += [str(config), "--no-progress", "--set", "deployment.nproc_per_node=2"]
    env = {**clean_env(), "GLOO_SOCKET_IFNAME": "lo"}
    process = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 240
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):
        assert process.poll() is None, process.stderr.read()[-3000:]
        assert time.monotonic() < deadline
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    (saved,) = sorted((run / "checkpoints").glob("step-*"))
    assert f"checkpoint {saved}; continue with --resume latest" in stderr
    assert saved.name != "step-0000010"
