"""`make setup` on a fresh machine: scripts/system_packages.sh installs the
system packages the Mooncake tests need with apt-get as root or with passwordless sudo, and
otherwise stops with the exact command to run; the Mooncake tests fail, never skip, when one is
missing. The script runs for real, with the system commands it calls replaced by recording stubs
on PATH (no test may install packages on the machine that runs it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "system_packages.sh"
ALL = ("libibverbs1", "iproute2", "util-linux")


def stub(folder: Path, name: str, body: str) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def run_script(
    tmp_path: Path, *, missing: tuple[str, ...], uid: int, sudo: str | None
) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run the script on a machine that lacks `missing`, as `uid`, with `sudo` = None (absent),
    'ok' (passwordless) or 'password'; return the result and the commands the stubs ran."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    record = f'echo "${{0##*/}} $*" >> {log}'
    verbs = "" if "libibverbs1" in missing else "echo '\tlibibverbs.so.1 (libc6,x86-64) => /x'"
    stub(bin_dir, "ldconfig", verbs)
    stub(bin_dir, "dpkg", "exit 1")  # the package database does not know it either
    if "iproute2" not in missing:
        stub(bin_dir, "ip", "exit 0")
    if "util-linux" not in missing:
        stub(bin_dir, "unshare", "exit 0")
    stub(bin_dir, "id", f"echo {uid}")
    stub(bin_dir, "apt-get", record)
    if sudo is not None:
        check = "exit 0" if sudo == "ok" else "exit 1"
        stub(bin_dir, "sudo", f'{record}\n[ "$2" = true ] && {check}\nshift\nexec "$@"')
    stub(bin_dir, "env", f'{record}\nshift\nexec "$@"')
    bash = shutil.which("bash")
    assert bash is not None
    done = subprocess.run(
        [bash, str(SCRIPT)],
        env={"PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    calls = log.read_text().splitlines() if log.is_file() else []
    return done, calls


def test_nothing_to_do_when_everything_is_there(tmp_path):
    done, calls = run_script(tmp_path, missing=(), uid=1000, sudo=None)
    assert done.returncode == 0, done.stderr
    assert calls == []


def test_root_installs_exactly_what_is_missing(tmp_path):
    done, calls = run_script(tmp_path, missing=ALL, uid=0, sudo=None)
    assert done.returncode == 0, done.stderr
    assert calls == [
        "apt-get update -qq",
        "env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq " + " ".join(ALL),
        "apt-get install -y -qq " + " ".join(ALL),
    ]


def test_passwordless_sudo_installs_through_sudo(tmp_path):
    done, calls = run_script(tmp_path, missing=("libibverbs1",), uid=1000, sudo="ok")
    assert done.returncode == 0, done.stderr
    assert "sudo -n apt-get update -qq" in calls
    assert "apt-get install -y -qq libibverbs1" in calls


@pytest.mark.parametrize("sudo", [None, "password"])
def test_without_root_it_stops_with_the_exact_command(tmp_path, sudo):
    done, calls = run_script(tmp_path, missing=("libibverbs1", "iproute2"), uid=1000, sudo=sudo)
    assert done.returncode == 1
    assert "Run: sudo apt-get update && sudo apt-get install -y libibverbs1 iproute2" in done.stderr
    assert not any(c.startswith(("apt-get", "env")) for c in calls)


def test_make_test_runs_setup_which_runs_the_script():
    makefile = (ROOT / "Makefile").read_text()
    assert "\ntest: setup\n" in makefile
    assert "\nsetup: system-packages $(BIN)/.installed\n" in makefile
    assert "\t./scripts/system_packages.sh\n" in makefile
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.rstrip().endswith("make test")


def test_the_mooncake_tests_fail_instead_of_skipping(tmp_path):
    """No `importorskip` or skip for a missing package in the Mooncake tests: the checks fail."""
    import system_support

    # The unit tests of the Mooncake store and the integration run, wherever the tree keeps them.
    mooncake_tests = sorted((ROOT / "tests").rglob("test_*mooncake*.py"))
    assert len(mooncake_tests) >= 2, mooncake_tests
    for path in mooncake_tests:
        text = path.read_text()
        assert "importorskip" not in text
        assert "require_mooncake()" in text and "require_namespace_tools()" in text
    probe = tmp_path / "test_probe.py"
    probe.write_text(
        "import system_support, shutil\n"
        "def test_missing(monkeypatch):\n"
        "    monkeypatch.setattr(shutil, 'which', lambda name: None)\n"
        "    system_support.require_namespace_tools()\n"
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--rootdir={tmp_path}",
            str(probe),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": str(Path(system_support.__file__).parent), "PATH": ""},
        cwd=tmp_path,
    )
    assert "1 failed" in done.stdout, done.stdout + done.stderr
    assert "sudo apt-get install -y iproute2 util-linux" in done.stdout
