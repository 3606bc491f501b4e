"""What the Mooncake tests need from the machine, checked so that a missing system package fails
the test with the command that installs it instead of skipping it (or failing on a bare
ImportError). `make setup` installs them all (scripts/system_packages.sh)."""

from __future__ import annotations

import shutil

import pytest

SETUP_HINT = "run `make setup` as root or with passwordless sudo, or"


def require_mooncake() -> None:
    """Fail (never skip) when Mooncake's store cannot be imported, naming the fix."""
    try:
        import mooncake.store  # noqa: F401
    except ModuleNotFoundError as exc:
        problem = (
            f"mooncake-transfer-engine is not installed ({exc}); {SETUP_HINT} "
            f"`pip install 'specdraft-trainer[mooncake]'`"
        )
    except ImportError as exc:
        package = "libibverbs1" if "libibverbs" in str(exc) else "the system library it names"
        problem = (
            f"Mooncake cannot load: {exc}; {SETUP_HINT} "
            f"`sudo apt-get update && sudo apt-get install -y {package}`"
        )
    else:
        return
    # Outside the except block, so the report is this line, not a chained traceback.
    pytest.fail(problem, pytrace=False)


def require_namespace_tools() -> None:
    """Fail (never skip) when `ip` or `unshare`, which build the tests' namespace, are missing."""
    missing = [
        pkg
        for tool, pkg in (("ip", "iproute2"), ("unshare", "util-linux"))
        if not shutil.which(tool)
    ]
    if missing:
        pytest.fail(
            f"the Mooncake tests run in a private network namespace and need "
            f"{' and '.join(missing)}; {SETUP_HINT} "
            f"`sudo apt-get update && sudo apt-get install -y {' '.join(missing)}`",
            pytrace=False,
        )
