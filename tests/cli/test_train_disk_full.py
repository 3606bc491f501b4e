"""A full disk never ends a run with a traceback: a checkpoint save that fails removes its
partial folder, logs one line (the error, the path, the bytes needed) and the run goes on; a
second failure in a row stops the run after checking the last good checkpoint; a failed metrics
write is retried; `--resume latest` on a full disk cuts metrics in place and leaves no temp file.
Failures are injected at the write seams (OSError ENOSPC), and once on a real full tmpfs."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from train_support import DIST_ENV, fit_run, single_thread, tiny_run, write_config

from specdraft.trainer.train import checkpoint as checkpoint_module
from specdraft.trainer.train.metrics import MetricsWriter, read_metrics
from specdraft.trainer.train.tracking.jsonl import JsonlFile


@pytest.fixture(autouse=True)
def _one_thread():
    with single_thread():
        yield


fit = fit_run


def full_disk_on(saves: set[int], monkeypatch) -> list[int]:
    """Make the checkpoint saves numbered in `saves` (1-based) fail with ENOSPC; return a log."""
    calls: list[int] = []
    real = checkpoint_module.write_checkpoint_file

    def write(path: Path, tensors):
        calls.append(len(calls) + 1)
        if len(calls) in saves:
            path.write_bytes(b"x" * 1000)  # a partial file, as a real full disk leaves one
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
        real(path, tensors)

    monkeypatch.setattr(checkpoint_module, "write_checkpoint_file", write)
    return calls


def steps(run: Path) -> list[str]:
    return sorted(p.name for p in (run / "checkpoints").iterdir())


SETTINGS = {"training": {"max_steps": 4, "save_interval": 1}}


def test_a_failed_save_is_logged_in_one_line_and_the_run_goes_on(
    tiny_target_path, tmp_path, monkeypatch, caplog
):
    full_disk_on({2}, monkeypatch)
    with caplog.at_level(logging.ERROR):
        result = fit(tiny_run(tiny_target_path, tmp_path / "run", **SETTINGS))
    assert result.stopped is None and result.final_step == 4
    # The failed step's partial folder is gone; the saves before and after it are whole.
    assert steps(tmp_path / "run") == ["step-0000001", "step-0000003", "step-0000004"]
    (line,) = [r.getMessage() for r in caplog.records if "not saved" in r.getMessage()]
    assert "checkpoint of step 2 not saved: ENOSPC (No space left on device)" in line
    assert ".tmp-step-0000002/model.safetensors" in line
    assert "a checkpoint needs about" in line and "free there" in line
    assert "training goes on, the next save is at step 3" in line
    assert "\n" not in line


def test_two_failed_saves_in_a_row_stop_the_run_after_checking_the_last_good_one(
    tiny_target_path, tmp_path, monkeypatch
):
    full_disk_on({2, 3}, monkeypatch)
    result = fit(tiny_run(tiny_target_path, tmp_path / "run", **SETTINGS))
    assert result.stopped == "save_failed"
    assert result.final_step == 3  # stopped at the second failure, not trained on to the end
    assert steps(tmp_path / "run") == ["step-0000001"]
    message = result.summary()["stop_message"]
    assert "2 save(s) in a row failed" in message
    assert "step-0000001 verifies" in message and "--resume latest" in message


def test_a_failed_metrics_write_is_retried_never_fatal(tiny_target_path, tmp_path, monkeypatch):
    failures = iter([True, True, False, False, False, False])
    real = JsonlFile._append

    def append(self, data: bytes) -> None:
        if next(failures, False):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(self, data)

    monkeypatch.setattr(JsonlFile, "_append", append)
    result = fit(tiny_run(tiny_target_path, tmp_path / "run", training={"max_steps": 4}))
    assert result.final_step == 4
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [row["step"] for row in rows] == [1, 2, 3, 4]  # the held lines came later, in order


def test_resume_cuts_metrics_in_place_when_nothing_can_be_rewritten(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    writer = MetricsWriter(path)
    for step in range(1, 7):
        writer.write(step, {"loss": 1.0})
    writer.close()
    with path.open("a") as handle:
        handle.write('{"step": 7, "lo')  # torn by a kill mid-write

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    from specdraft.trainer.runtime import atomic

    monkeypatch.setattr(atomic, "atomic_write", no_space)
    (tmp_path / ".metrics.jsonl.tmp").write_bytes(b"")  # what older versions left behind
    writer = MetricsWriter(path)
    assert writer.truncate_after(3) == 4
    writer.write(4, {"loss": 2.0})
    writer.close()
    assert [row["step"] for row in read_metrics(path)] == [1, 2, 3, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]


FULL_DISK = textwrap.dedent(
    """
    set -u
    mount -t tmpfs -o size=9m tmpfs "$RUN" || exit 90
    "$PY" -m specdraft.cli train "$CFG" --no-progress > "$LOG/first.out" 2> "$LOG/first.err"
    echo $? > "$LOG/first.rc"
    "$PY" -m specdraft.cli train "$CFG" --no-progress --resume latest \\
        > "$LOG/resume.out" 2> "$LOG/resume.err"
    echo $? > "$LOG/resume.rc"
    ls -a "$RUN" "$RUN/checkpoints" > "$LOG/files"
    """
)


def unshare_works() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.subprocess
@pytest.mark.skipif(not unshare_works(), reason="needs root and unshare -m for a small tmpfs")
def test_a_real_full_disk_stops_cleanly_and_resume_does_not_die_on_metrics(
    tiny_target_path, tmp_path
):
    run, logs = tmp_path / "run", tmp_path / "logs"
    run.mkdir()
    logs.mkdir()
    # 10 steps, a checkpoint (about 6 MB) every 3: the first fits in 9 MB, the next two do not.
    config = write_config(
        tmp_path / "run.toml",
        tiny_run(
            tiny_target_path,
            run,
            data={"max_samples": 40},
            training={"grad_accum_steps": 2, "max_steps": 10, "save_interval": 3},
        ),
    )
    env = {k: v for k, v in os.environ.items() if k not in DIST_ENV}
    env.update(OMP_NUM_THREADS="1", RUN=str(run), CFG=str(config), LOG=str(logs), PY=sys.executable)
    done = subprocess.run(
        ["unshare", "-m", "sh", "-c", FULL_DISK], env=env, capture_output=True, timeout=400
    )
    assert done.returncode == 0, done.stderr[-2000:]
    first = (logs / "first.err").read_text()
    assert (logs / "first.rc").read_text().strip() == "1", first[-3000:]
    assert "Traceback" not in first
    assert "checkpoint of step 6 not saved: ENOSPC" in first
    assert "step-0000003 verifies" in first
    resumed = (logs / "resume.err").read_text()
    assert "Traceback" not in resumed, resumed[-3000:]
    assert "resumed from" in resumed
    files = (logs / "files").read_text().split()
    assert "step-0000003" in files
    assert not [name for name in files if name.startswith(".tmp") or name.endswith(".tmp")]
