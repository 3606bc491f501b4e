"""Start vLLM for specdraft: find the vLLM venv's interpreter, run vllm_child.py there, read back.

vLLM lives in a venv of its own (scripts/vllm_cpu_venv.sh builds the CPU one into
build/vllm-venv): its pinned torch and transformers differ from specdraft's. The child gets the
environment vLLM's CPU build needs (a 1 GiB KV cache, no hub access) on top of this one's.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from ..runtime.service_process import run_to_end

VENV_SCRIPT = "scripts/vllm_cpu_venv.sh"
DEFAULT_VENV = Path("build") / "vllm-venv"
# What vLLM's CPU build needs here: a 1 GiB KV cache (its default wants 4 GiB), no hub access.
CHILD_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    # The engine core in this child process, not in one it spawns (vllm_child.engine_kwargs).
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
}


class VllmUnavailable(RuntimeError):
    """No interpreter with vLLM was found (or the one given cannot import it)."""


class VllmChildFailed(RuntimeError):
    """The vLLM child process ended without writing a result."""


def repository_root() -> Path | None:
    """The specdraft checkout this package runs from (editable install), if it is one."""
    for folder in Path(__file__).resolve().parents:
        if (folder / VENV_SCRIPT).is_file():
            return folder
    return None


def default_vllm_python() -> Path:
    """build/vllm-venv/bin/python of the working directory, else of the specdraft checkout."""
    candidates = [Path.cwd() / DEFAULT_VENV / "bin" / "python"]
    root = repository_root()
    if root is not None:
        candidates.append(root / DEFAULT_VENV / "bin" / "python")
    for candidate in candidates:
        if candidate.exists():
            return candidate
    raise VllmUnavailable(
        f"no vLLM venv at {DEFAULT_VENV} (looked in {', '.join(str(c) for c in candidates)}); "
        f"build the CPU one with `bash {VENV_SCRIPT}`, or pass --vllm-python PATH"
    )


def check_vllm_python(python: Path) -> str:
    """vLLM's version in `python`; VllmUnavailable naming the fix when it has none."""
    if not Path(python).exists():
        raise VllmUnavailable(
            f"--vllm-python {python} does not exist; build the CPU venv with "
            f"`bash {VENV_SCRIPT}` (build/vllm-venv), or pass an interpreter that has vLLM"
        )
    done = run_to_end(
        [str(python), "-c", "import vllm; print(vllm.__version__)"],
        capture_output=True,
        text=True,
        env=child_env(),
        timeout=300,
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise VllmUnavailable(
            f"{python} cannot import vllm ({last}); build the CPU venv with `bash {VENV_SCRIPT}`"
        )
    return done.stdout.strip()


def child_env() -> dict[str, str]:
    """This environment plus what vLLM's CPU build needs (existing settings are kept)."""
    env = dict(os.environ)
    for key, value in CHILD_ENV.items():
        env.setdefault(key, value)
    return env


def run_vllm_child(
    request: dict[str, Any], *, python: Path, timeout: float = 1800, log: Path | None = None
) -> dict[str, Any]:
    """Run vllm_child.py with `request` under `python`; its JSON result."""
    script = Path(__file__).with_name("vllm_child.py")
    with tempfile.TemporaryDirectory(prefix="specdraft-vllm-") as tmp:
        request_file, result_file = Path(tmp) / "request.json", Path(tmp) / "result.json"
        request_file.write_text(json.dumps(request))
        log_file = log or Path(tmp) / "vllm.log"
        with open(log_file, "w") as output:
            try:
                done = run_to_end(
                    [str(python), str(script), str(request_file), str(result_file)],
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    env=child_env(),
                    cwd=tmp,
                    timeout=timeout,
                )
            except subprocess.TimeoutExpired:
                raise VllmChildFailed(
                    f"vLLM did not finish within {timeout:.0f} s (log: {log_file})"
                ) from None
        if not result_file.is_file():
            tail = "\n".join(log_file.read_text(errors="replace").splitlines()[-15:])
            raise VllmChildFailed(f"vLLM exited with code {done.returncode}, no result:\n{tail}")
        return json.loads(result_file.read_text())
