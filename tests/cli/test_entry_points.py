"""The runtime's processes start from package entry points: `specdraft serve-producer` for users,
`python -m specdraft.trainer.disagg.<part>` for the managed run, never the CLI from the library."""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from disagg_runtime import make_prompts, runtime_config, write_config_toml, write_prompts_jsonl
from train_support import DIST_ENV

from specdraft.cli.main import cli
from specdraft.trainer.disagg.managed.run import capture_service, trainer_command
from specdraft.trainer.disagg.managed.supervisor import producer_service
from specdraft.trainer.launch import LaunchPlan
from specdraft.trainer.request import RunRequest
from specdraft.trainer.runtime.http_client import call_json
from specdraft.trainer.runtime.run_secret import read_run_secret

TRAINER_SRC = Path(__file__).resolve().parents[2] / "packages" / "trainer" / "src"


@pytest.mark.subprocess
def test_serve_producer_plans_the_run_and_serves_windows_until_sigterm(tiny_target_path, tmp_path):
    run = tmp_path / "run"
    cfg = runtime_config(tiny_target_path, run, world_size=1)
    config = write_config_toml(cfg, tmp_path / "run.toml")
    prompts = write_prompts_jsonl(make_prompts(8), tmp_path / "prompts.jsonl")
    env = {k: v for k, v in os.environ.items() if k not in (*DIST_ENV, "SPECDRAFT_RUN_SECRET")}
    env["OMP_NUM_THREADS"] = "1"
    argv = [sys.executable, "-m", "specdraft.cli", "serve-producer", str(config)]
    # No --run-dir: the producer works in output_dir, where the trainer ranks look for it.
    argv += ["--prompts", str(prompts), "--capture-url", "http://127.0.0.1:9", "--port", "0"]
    producer = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    address = run / "disagg" / "controller.json"
    try:
        deadline = time.monotonic() + 120
        while not address.exists() and producer.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert address.exists(), "the producer wrote no controller address"
        url = json.loads(address.read_text())["url"]
        plan = call_json("GET", f"{url}/plan", timeout=10, secret=read_run_secret(run))
        assert plan["run"] == cfg.run_id and plan["world_size"] == 1
        assert plan["total_steps"] > 0
    finally:
        if producer.poll() is None:
            producer.send_signal(signal.SIGTERM)
        _, err = producer.communicate(timeout=60)
    assert producer.returncode == 0, err[-3000:]


def test_serve_producer_names_the_line_of_a_broken_prompts_file(tiny_target_path, tmp_path):
    cfg = runtime_config(tiny_target_path, tmp_path / "run", world_size=1)
    config = write_config_toml(cfg, tmp_path / "run.toml")
    broken = tmp_path / "rows.jsonl"
    broken.write_text('{"sample_id": 0, "input_ids": [1], "loss_mask": [1]}\n{not json\n')
    done = CliRunner().invoke(cli, ["serve-producer", str(config), "--prompts", str(broken)])
    assert done.exit_code == 2
    assert f"{broken}:2: not JSON" in done.output


def test_the_managed_run_starts_package_entry_points(tiny_target_path, tmp_path):
    plan = LaunchPlan(nproc_per_node=2)
    cfg = runtime_config(tiny_target_path, tmp_path / "run", world_size=2)
    config = write_config_toml(cfg, tmp_path / "run.toml")
    capture, _url = capture_service("run.toml", ["training.seed=3"], 0)
    producer = producer_service("run.toml", tmp_path, max_restarts=1)
    trainers = trainer_command(RunRequest.create(str(config), launch=plan))
    assert capture.argv[1:3] == ["-m", "specdraft.trainer.disagg.capture"]
    assert producer.argv[1:3] == ["-m", "specdraft.trainer.disagg.producer"]
    assert trainers[1:3] == ["-m", "specdraft.trainer.disagg.consumer"]
    for argv in (capture.argv, producer.argv, trainers):
        # Each module is runnable: `python -m` needs its __main__.
        module = argv[2].replace(".", "/")
        assert (TRAINER_SRC / module / "__main__.py").is_file(), argv[2]


def test_no_trainer_module_imports_or_starts_the_cli():
    """The CLI depends on the trainer package; the reverse would be a cycle at run time."""
    offenders = []
    for path in sorted(TRAINER_SRC.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names.append(node.module)
            elif isinstance(node, ast.Import):
                names += [alias.name for alias in node.names]
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.append(node.value)
            if any(name.startswith("specdraft.cli") for name in names):
                offenders.append(f"{path.relative_to(TRAINER_SRC)}:{node.lineno}")
    assert offenders == []
