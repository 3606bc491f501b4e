"""`specdraft explain-buckets`: JSON on a fixed length file, text, --longest, the corpus, errors."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

from specdraft.cli.main import cli
from specdraft.collate import resolve_static_length

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "qwen3-8b-dflash2-2048.toml"
LENGTHS = [37, 128, 129, 511, 513, 1000, 1024, 1025, 1536, 1537, 2000, 2048]


@pytest.fixture(scope="module")
def run():
    runner = CliRunner()

    def invoke(*args: str):
        return runner.invoke(cli, ["explain-buckets", *args], catch_exceptions=False)

    return invoke


@pytest.fixture
def lengths_file(tmp_path: Path) -> Path:
    path = tmp_path / "lengths.txt"
    path.write_text("\n".join(str(n) for n in LENGTHS) + "\n")
    return path


def test_json_on_a_fixed_length_file(run, lengths_file: Path) -> None:
    result = run(
        str(EXAMPLE),
        "--lengths",
        str(lengths_file),
        "--format",
        "json",
        "--set",
        "training.micro_batch_size=1",
        "--suggest",
        "2",
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    buckets = (512, 1024, 1536, 2048)
    positions = {p["name"]: p["computed_positions"] for p in report["policies"]}
    assert positions == {
        "pad-to-longest": sum(LENGTHS),
        "static_shapes": 2048 * len(LENGTHS),
        "buckets": sum(resolve_static_length(n, buckets) for n in LENGTHS),
    }
    assert report["source"]["samples"] == len(LENGTHS)
    assert report["pad_policy"]["pad_to"] == list(buckets)
    resolved = [resolve_static_length(n, buckets) for n in LENGTHS]
    assert [b["micro_batches"] for b in report["buckets"]] == [resolved.count(b) for b in buckets]
    assert report["compile_plan"]["graphs_per_block"] == 8
    assert len(report["suggestion"]["buckets"]) == 2
    assert report["suggestion"]["buckets"][-1] == 2048


def test_text_prints_the_three_policies_and_appended_max_length(run, lengths_file: Path) -> None:
    result = run(
        str(EXAMPLE),
        "--lengths",
        str(lengths_file),
        "--set",
        "training.static_shape_buckets=[512, 1024]",
    )
    assert result.exit_code == 0, result.output
    assert "buckets 512, 1024, 2048 (max_length 2048 appended)" in result.stdout
    for name in ("pad-to-longest", "static_shapes", "buckets (configured)"):
        assert name in result.stdout


def test_longest_shows_the_bucket_it_pads_to(run) -> None:
    result = run(str(EXAMPLE), "--longest", "1100", "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["longest"] == {"longest": 1100, "pads_to": 1536}


def test_longest_above_max_length_is_a_usage_error(run) -> None:
    result = run(str(EXAMPLE), "--longest", "3000")
    assert result.exit_code == 2
    assert "--longest 3000 is above data.max_length = 2048" in result.stderr


def test_bad_config_is_reported_with_its_position(run, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(EXAMPLE.read_text().replace("[512, 1024, 1536, 2048]", "[512, 1000]"))
    result = run(str(bad), "--longest", "10")
    assert result.exit_code == 2
    line = next(n for n, text in enumerate(bad.read_text().splitlines(), 1) if "1000" in text)
    assert f"{bad}:{line}:" in result.stderr
    assert "1000" in result.stderr


def test_bad_lengths_file_names_file_and_line(run, tmp_path: Path) -> None:
    path = tmp_path / "lengths.txt"
    path.write_text("5\nfive\n")
    result = run(str(EXAMPLE), "--lengths", str(path))
    assert result.exit_code == 2
    assert f"{path}:2:" in result.stderr


def test_conflicting_sources_are_a_usage_error(run, lengths_file: Path) -> None:
    result = run(str(EXAMPLE), "--lengths", str(lengths_file), "--longest", "5")
    assert result.exit_code == 2
    assert "either --lengths FILE or --longest N" in result.stderr


def test_plot_writes_a_png(run, lengths_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "plot.png"
    result = run(str(EXAMPLE), "--lengths", str(lengths_file), "--plot", str(out))
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:4] == b"\x89PNG"


@dataclass
class FakeCorpus:
    lengths: list[int]
    skipped: dict[str, int] = field(default_factory=dict)
    dropped_incomplete: int = 0
    source: str = "pkg:sharegpt"


def test_corpus_is_read_through_the_data_pipeline(run, monkeypatch) -> None:
    calls = []

    def corpus_lengths(config, *, progress: bool = True) -> FakeCorpus:
        calls.append((config.data.max_length, progress))
        return FakeCorpus(LENGTHS, {"no_assistant_turn": 3}, 1)

    module = types.ModuleType("specdraft.trainer.data")
    module.corpus_lengths = corpus_lengths  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "specdraft.trainer.data", module)
    result = run(str(EXAMPLE), "--format", "json")
    assert result.exit_code == 0, result.output
    assert calls == [(2048, True)]
    source = json.loads(result.stdout)["source"]
    assert source == {
        "kind": "corpus",
        "description": "pkg:sharegpt",
        "samples": len(LENGTHS),
        "skipped": {"no_assistant_turn": 3},
        "dropped_incomplete": 1,
        "truncated_to_max_length": 0,
    }


def test_corpus_that_cannot_load_is_a_clean_error(run, monkeypatch) -> None:
    def corpus_lengths(config, *, progress: bool = True) -> FakeCorpus:
        raise FileNotFoundError("model.target = '/models/Qwen3-8B': no such folder")

    module = types.ModuleType("specdraft.trainer.data")
    module.corpus_lengths = corpus_lengths  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "specdraft.trainer.data", module)
    result = run(str(EXAMPLE))
    assert result.exit_code == 2
    assert "cannot load the corpus: model.target = '/models/Qwen3-8B'" in result.stderr
