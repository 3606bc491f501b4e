"""Every child specdraft starts is stopped one way: SIGTERM to its whole process group, SIGKILL
after the grace, so no worker it forked (a rank, an engine core) outlives it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from specdraft.trainer.runtime.service_process import ChildProcess, run_to_end

# A parent that forks a grandchild into its group, prints the grandchild's pid, and waits.
# With IGNORE, both ignore SIGTERM (a worker stuck in a collective, a save that never ends).
FAMILY = """
import os, signal, subprocess, sys, time
if sys.argv[1] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
worker = subprocess.Popen([sys.executable, "-c", sys.argv[2]])
print(worker.pid, flush=True)
time.sleep(600)
"""
WORKER = "import signal, sys, time\nif {ignore}: signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
WORKER += "time.sleep(600)"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie the test's process does not reap still answers kill(0): read its state.
    with open(f"/proc/{pid}/stat") as handle:
        return handle.read().rsplit(")", 1)[1].split()[0] != "Z"


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("ignore", [False, True])
def test_stop_ends_the_child_and_the_workers_it_forked(ignore):
    mode = "ignore" if ignore else "obey"
    command = [sys.executable, "-c", FAMILY, mode, WORKER.format(ignore=ignore)]
    child = ChildProcess("family", command, stdout=subprocess.PIPE)
    worker = int(child.popen.stdout.readline())
    started = time.monotonic()
    code = child.stop(grace=1.0)
    # SIGTERM ends an obedient family at once; one that ignores it is killed after the grace.
    assert code == (-signal.SIGKILL if ignore else -signal.SIGTERM)
    assert (time.monotonic() - started >= 1.0) == ignore
    assert _gone(worker), "the forked worker outlived its stopped parent"
    child.popen.stdout.close()


def test_run_to_end_stops_the_whole_group_when_it_runs_over():
    command = [sys.executable, "-c", FAMILY, "obey", WORKER.format(ignore=False)]
    with pytest.raises(subprocess.TimeoutExpired):
        run_to_end(command, timeout=2.0, grace=1.0, capture_output=True, text=True)
    # The grandchild's pid went to the captured output, which TimeoutExpired may not carry:
    # look for any sleeper of ours still in a session the call started.
    time.sleep(0.2)
    leftovers = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    if b"time.sleep(600)" in handle.read() and _alive(int(entry)):
                        leftovers.append(entry)
            except OSError:
                continue
    assert leftovers == []


def test_run_to_end_returns_like_subprocess_run():
    done = run_to_end(
        [sys.executable, "-c", "import os; print(os.environ['PROBE'])"],
        timeout=60,
        env={"PROBE": "seen"},
        capture_output=True,
        text=True,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "seen")
