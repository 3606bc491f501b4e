"""The run's secret: 256 random bits that every request between a run's processes carries.

It lives in `<run_dir>/disagg/secret` (0600, in a 0700 folder); the environment variable
`SPECDRAFT_RUN_SECRET` overrides it for processes that do not share the run folder. The first
process of a run that needs it creates it, race-free (`link()` lets one file win).
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from .atomic import fsync_dir, fsync_file, temp_name
from .private import private_dir

SECRET_ENV = "SPECDRAFT_RUN_SECRET"
SECRET_NAME = "secret"


class SecretError(RuntimeError):
    """The run's secret file is unreadable, empty or readable by others (names the fix)."""


def run_secret_path(run_dir: str | Path) -> Path:
    """Where a run folder keeps the secret its services and trainers share."""
    return Path(run_dir) / "disagg" / SECRET_NAME


def read_run_secret(run_dir: str | Path) -> str | None:
    """The run's secret ($SPECDRAFT_RUN_SECRET, else the run folder's file), or None if none."""
    from_env = os.environ.get(SECRET_ENV)
    if from_env:
        return from_env
    path = run_secret_path(run_dir)
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    if stat.S_IMODE(info.st_mode) & 0o077:
        raise SecretError(
            f"{path} is readable by other users (mode {stat.S_IMODE(info.st_mode):o}): anyone "
            f"who reads it can drive this run; run `chmod 600 {path}`"
        )
    try:
        secret = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise SecretError(f"cannot read the run secret {path}: {exc}") from exc
    if not secret:
        raise SecretError(f"the run secret {path} is empty: delete it and restart the run")
    return secret


def ensure_run_secret(run_dir: str | Path) -> str:
    """The run's secret; created (0600, 256 random bits) on first use, race-free."""
    existing = read_run_secret(run_dir)
    if existing:
        return existing
    path = run_secret_path(run_dir)
    private_dir(path.parent)
    tmp = temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as fh:
        fh.write(secrets.token_hex(32) + "\n")
    try:
        # On disk before it has a name: a crash never leaves an empty secret behind.
        fsync_file(tmp)
        # link() fails when another process of the run made the secret first: use theirs.
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
    # The services of a restarted run must find the secret the running ones hold.
    fsync_dir(path.parent)
    secret = read_run_secret(run_dir)
    assert secret is not None
    return secret
