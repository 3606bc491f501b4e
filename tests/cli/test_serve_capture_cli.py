"""`specdraft serve-capture`: the embedded capture server started by the command."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from disagg_support import build_random_target

from specdraft.cli.serve_capture_cmd import serve_capture
from specdraft.trainer.disagg.capture import HttpCaptureClient
from specdraft.trainer.disagg.store import LocalFeatureStore, read_sample
from specdraft.trainer.disagg.wire import CaptureRejected, CaptureRequest, capture_spec
from specdraft.trainer.runtime.run_secret import SECRET_ENV, read_run_secret, run_secret_path

PROMPT = [3, 17, 42, 99, 7, 250, 1, 64, 12]
MASK = [0, 0, 0, 1, 1, 1, 0, 1, 1]


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return build_random_target(tmp_path_factory.mktemp("target"))


@pytest.mark.slow
def test_serve_capture_command_serves_until_sigterm(target, tmp_path):
    cfg_path = tmp_path / "cfg.toml"
    cfg_path.write_text(
        f"""run_id = "clirun"
output_dir = "{tmp_path / "run"}"
[model]
target = "{target}"
algorithm = "dspark"
target_layer_ids = [1, 0]
mask_token_id = 5
dtype = "float32"
block_size = 8
[data]
train_paths = ["unused.jsonl"]
[deployment]
mode = "disaggregated"
"""
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "specdraft.cli",
            "serve-capture",
            str(cfg_path),
            "--port",
            "0",
            "--set",
            "data.max_length=64",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={
            **{k: v for k, v in os.environ.items() if k != SECRET_ENV},
            "PYTHONUNBUFFERED": "1",
        },
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("capture server listening on http://127.0.0.1:"), (
            line + proc.stderr.read()
        )
        url = line.split()[-1]
        spec = capture_spec([1, 0], 64, algorithm="dspark")
        # The command made the run folder private and its secret, and serves only with it.
        run_dir = tmp_path / "run"
        assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
        assert stat.S_IMODE(run_secret_path(run_dir).stat().st_mode) == 0o600
        secret = read_run_secret(run_dir)
        request = CaptureRequest("clirun", 0, 0, PROMPT, MASK)
        with pytest.raises(CaptureRejected, match="401"):
            HttpCaptureClient(url, spec).capture(request, timeout=60)
        reply = HttpCaptureClient(url, spec, secret=secret).capture(request, timeout=60)
        store = LocalFeatureStore(run_dir / "feature-store")
        assert read_sample(store, reply)["target_last_hidden_states"].shape == (len(PROMPT), 64)
        with pytest.raises(CaptureRejected, match="413"):  # --set reached the server
            HttpCaptureClient(url, spec, secret=secret).capture(
                CaptureRequest("clirun", 1, 0, [1] * 65, [1] * 65), timeout=60
            )
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0


def test_serve_capture_reports_a_bad_config(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('run_id = "x"\n')
    result = CliRunner().invoke(serve_capture, [str(bad)])
    assert result.exit_code == 2
    assert "bad.toml" in result.output and "model" in result.output
