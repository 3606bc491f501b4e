"""The specdraft cache folder and its build-once entries (shared by data, assets, regenerate)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from specdraft.trainer.runtime.cache import CACHE_ENV, build_once, cache_root


def test_cache_root_prefers_the_argument_then_the_environment_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "env"))
    assert cache_root(tmp_path / "arg") == tmp_path / "arg"
    assert cache_root() == tmp_path / "env"
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "specdraft"


def test_build_once_builds_a_single_time_under_concurrent_callers(tmp_path):
    calls = []
    final = tmp_path / "entry"

    def build(folder: Path) -> None:
        calls.append(folder)
        (folder / "payload").write_text("done")

    threads = [threading.Thread(target=build_once, args=(final, build)) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert (final / "payload").read_text() == "done"
    # No temporary folder is left behind next to the entry.
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == ["entry"]


def test_a_failed_build_leaves_no_entry(tmp_path):
    def build(folder: Path) -> None:
        (folder / "half").write_text("x")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        build_once(tmp_path / "entry", build)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []
