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
class FakeReport:
    skipped: dict[str, int] = field(default_factory=dict)
    dropped_incomplete: int = 0
    source: str = "pkg:sharegpt"


def fake_data_module(build_dataset) -> types.ModuleType:
    """specdraft.trainer.data as far as explain-buckets uses it."""
    module = types.ModuleType("specdraft.trainer.data")
    module.build_dataset = build_dataset  # type: ignore[attr-defined]
    module.sample_lengths = lambda rows: [len(r["input_ids"]) for r in rows]  # type: ignore[attr-defined]
    return module


def test_corpus_is_read_through_the_data_pipeline(run, monkeypatch) -> None:
    calls = []

    def build_dataset(config, *, split: str, progress: bool = True):
        calls.append((config.data.max_length, split, progress))
        rows = [{"input_ids": [0] * n, "loss_mask": [1] * n} for n in LENGTHS]
        return rows, FakeReport({"no_assistant_turn": 3}, 1)

    monkeypatch.setitem(sys.modules, "specdraft.trainer.data", fake_data_module(build_dataset))
    result = run(str(EXAMPLE), "--format", "json")
    assert result.exit_code == 0, result.output
    assert calls == [(2048, "train", True)]
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
    def build_dataset(config, *, split: str, progress: bool = True):
        raise FileNotFoundError("model.target = '/models/Qwen3-8B': no such folder")

    monkeypatch.setitem(sys.modules, "specdraft.trainer.data", fake_data_module(build_dataset))
    result = run(str(EXAMPLE))
    assert result.exit_code == 2
    assert "cannot load the corpus: model.target = '/models/Qwen3-8B'" in result.stderr


@pytest.fixture(scope="module")
def tiny_corpus_config(tmp_path_factory) -> Path:
    """A static run on the packaged ShareGPT sample, tokenised by the tiny target's real tokenizer.

    explain-buckets builds no model, so the config names the tokenizer (data.tokenizer) and a
    target folder that does not exist: building (pre-training) the tiny target cost ~2 minutes
    on a cold cache, the tokenizer alone takes seconds.
    """
    from specdraft.trainer.assets import build_tiny_tokenizer, tiny_assets_info

    folder = tmp_path_factory.mktemp("explain-anchors")
    path = folder / "tiny.toml"
    path.write_text(
        f"""
run_id = "explain-anchors"
output_dir = "{folder / "run"}"
[model]
target = "{folder / "no-target-needed"}"
algorithm = "dflash2"
block_size = 8
num_draft_layers = 2
target_layer_ids = [0, 2]
mask_token_id = {tiny_assets_info().mask_token_id}
[model.dflash2]
selector_gold_policy = "insert"
[data]
train_paths = ["pkg:sharegpt"]
max_length = 256
max_samples = 24
tokenizer = "{build_tiny_tokenizer()}"
cache_dir = "{folder / "cache"}"
[training]
micro_batch_size = 1
num_anchors = 256
static_shapes = true
static_shape_buckets = [128]
static_anchor_buckets = [128]
"""
    )
    return path


def report_warnings(result) -> list[dict]:
    return json.loads(result.stdout)["warnings"]


def test_anchor_occupancy_comes_from_the_corpus_masks_and_the_runs_sampler(
    run, tiny_corpus_config: Path
) -> None:
    import torch

    from specdraft.collate import anchor_counts, plan_micro_batches
    from specdraft.config import load_config
    from specdraft.trainer.data import build_dataset, sample_lengths

    result = run(str(tiny_corpus_config), "--format", "json", "--suggest-anchors", "2")
    assert result.exit_code == 0, result.output
    anchors = json.loads(result.stdout)["anchors"]

    # Recount independently: the same dataset, masks and sampler, widths by the rules by hand.
    config = load_config(tiny_corpus_config)
    dataset, _ = build_dataset(config, split="train", progress=False)
    lengths = sample_lengths(dataset)
    counts = [anchor_counts(torch.tensor([row["loss_mask"]]))[0] for row in dataset]
    batches = plan_micro_batches(
        lengths,
        micro_batch_size=1,
        sampler="length_grouped" if config.data.length_grouped else "random",
        seed=config.training.seed,
        mega_batch_multiplier=config.data.mega_batch_multiplier,
    )
    needs = [max(min(256, counts[i]) for i in b) for b in batches]
    # The packaged sample holds short and long assistant turns: both widths are needed.
    assert min(needs) <= 128 < max(needs)
    valid = sum(min(256, c) for c in counts)
    computed = {
        "pad-to-longest": sum(len(b) * max(1, n) for b, n in zip(batches, needs, strict=True)),
        "static (num_anchors)": sum(len(b) * 256 for b in batches),
        "anchor buckets": sum(
            len(b) * (128 if n <= 128 else 256) for b, n in zip(batches, needs, strict=True)
        ),
    }
    policies = {p["name"]: p for p in anchors["policies"]}
    grouped = {"pad-to-longest + anchor_grouped", "anchor buckets + anchor_grouped"}
    assert set(policies) == set(computed) | grouped
    assert policies["anchor buckets"]["configured"]
    # One sample per micro-batch: grouping by anchor count cannot change a width, nor is it hinted.
    for name in grouped:
        assert policies[name]["computed_blocks"] == computed[name.split(" + ")[0]]
        assert not policies[name]["configured"]
    assert not [w for w in report_warnings(result) if w["code"] == "anchor-grouping"]
    for name, blocks in computed.items():
        assert policies[name]["computed_blocks"] == blocks, name
        assert policies[name]["valid_blocks"] == valid
        assert policies[name]["occupancy"] == pytest.approx(valid / blocks)
    # The grid: 2 lengths x 2 widths, every micro-batch in exactly one cell.
    cells = {(c["length"], c["width"]): c for c in anchors["cells"]}
    assert set(cells) == {(128, 128), (128, 256), (256, 128), (256, 256)}
    assert sum(c["micro_batches"] for c in cells.values()) == len(batches)
    for (length, width), cell in cells.items():
        inside = [
            n
            for b, n in zip(batches, needs, strict=True)
            if (128 if max(lengths[i] for i in b) <= 128 else 256) == length
            and (128 if n <= 128 else 256) == width
        ]
        assert cell["micro_batches"] == len(inside), (length, width)
    unused = [w for w in report_warnings(result) if w["code"] == "unused-cell"]
    assert [w["message"].split(" is ")[0] for w in unused] == [
        f"grid cell {length} x {width} anchors"
        for (length, width), cell in cells.items()
        if not cell["micro_batches"]
    ]
    # The exact suggestion is never worse than the configured buckets of the same count.
    suggestion = anchors["suggestion"]
    assert suggestion["anchor_buckets"][-1] == 256 and len(suggestion["anchor_buckets"]) == 2
    assert suggestion["computed_blocks"] <= computed["anchor buckets"]


def test_text_shows_the_anchor_dimension(run, tiny_corpus_config: Path) -> None:
    result = run(str(tiny_corpus_config), "--suggest-anchors", "2")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "anchors     anchor buckets 128, 256" in out
    assert "shape grid  4 cell(s) (length x anchors): 128x128, 128x256, 256x128, 256x256" in out
    assert "anchor blocks side by side" in out and "per grid cell" in out
    assert "set training.static_anchor_buckets = [" in out


def test_suggest_anchors_needs_the_corpus(run, lengths_file: Path) -> None:
    result = run(str(EXAMPLE), "--lengths", str(lengths_file), "--suggest-anchors", "2")
    assert result.exit_code == 2
    assert "--suggest-anchors needs the loss masks of the corpus" in result.stderr


def test_plot_draws_the_shape_grid_the_text_lists(run, tiny_corpus_config: Path, tmp_path) -> None:
    from PIL import Image

    from specdraft.collate.anchor_accounting import GRID_PLOT_KEY

    out = tmp_path / "buckets.png"
    result = run(str(tiny_corpus_config), "--plot", str(out))
    assert result.exit_code == 0, result.output
    grid_png = tmp_path / "buckets-grid.png"
    assert f"shape grid plot written to {grid_png}" in result.stderr
    assert out.read_bytes()[:4] == b"\x89PNG"
    # The cells the text report lists under "per grid cell": length, width, batches, occupancy.
    lines = result.stdout.splitlines()
    start = lines.index("per grid cell (the configured policy, one epoch)") + 2
    listed = {}
    for line in lines[start:]:
        parts = line.split()
        if len(parts) != 5 or not parts[0].isdigit():
            break
        listed[(int(parts[0]), int(parts[1]))] = (int(parts[2]), parts[4])
    assert set(listed) == {(128, 128), (128, 256), (256, 128), (256, 256)}
    # Read back the numbers the figure drew (stored in its PNG text chunk), not pixels.
    with Image.open(grid_png) as image:
        drawn = json.loads(image.text[GRID_PLOT_KEY])
        assert image.size[0] > 300 and image.size[1] > 150
    assert drawn["lengths"] == [128, 256] and drawn["widths"] == [128, 256]
    for (length, width), (batches, occupancy) in listed.items():
        row, col = drawn["lengths"].index(length), drawn["widths"].index(width)
        assert drawn["micro_batches"][row][col] == batches
        value = drawn["occupancy"][row][col]
        if batches:
            assert f"{value:.1%}" == occupancy
        else:
            assert value is None
    assert sum(map(sum, drawn["micro_batches"])) == sum(b for b, _ in listed.values()) > 0


def test_plot_without_a_grid_draws_only_the_histogram(run, lengths_file: Path, tmp_path) -> None:
    out = tmp_path / "lengths.png"
    result = run(str(EXAMPLE), "--lengths", str(lengths_file), "--plot", str(out))
    assert result.exit_code == 0, result.output
    assert out.exists() and not (tmp_path / "lengths-grid.png").exists()
    assert "shape grid plot" not in result.stderr


# ------------------------------------------------------------------------------------ packing

PACKED = ("--set", "training.packing=true")


def test_packing_rows_come_from_the_training_sampler(run, lengths_file: Path) -> None:
    from specdraft.collate import MicroBatchSampler, ShapePolicy, split_rows
    from specdraft.config import load_config

    result = run(str(EXAMPLE), "--lengths", str(lengths_file), "--format", "json", *PACKED)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    names = [p["name"] for p in report["policies"]]
    assert names == ["pad-to-longest", "static_shapes", "buckets", "packing", "packing + buckets"]
    assert [p["configured"] for p in report["policies"]] == [False] * 4 + [True]
    assert report["pad_policy"]["packing"] is True
    # Recount independently: the run's sampler (every rank) and the collator's rows.
    config = load_config(EXAMPLE, ["training.packing=true"])
    shapes = ShapePolicy.from_config(config)
    training = config.training
    plan = MicroBatchSampler(
        LENGTHS,
        micro_batch_size=training.micro_batch_size,
        grad_accum_steps=training.grad_accum_steps,
        num_replicas=config.deployment.world_size,
        seed=training.seed,
        mega_batch_multiplier=config.data.mega_batch_multiplier,
        pad_to=shapes,
    ).epoch_plan(0)
    batches = [b for rank in plan for b in rank if b]
    totals = [
        [sum(LENGTHS[b[p]] for p in row) for row in split_rows([LENGTHS[i] for i in b], 2048)]
        for b in batches
    ]
    size = training.micro_batch_size
    computed = sum(size * shapes.pad_length(max(t)) for t in totals)
    packed = {p["name"]: p for p in report["packing"]}
    assert packed["packing + buckets"]["computed_positions"] == computed
    assert packed["packing"]["computed_positions"] == size * 2048 * len(batches)
    for p in packed.values():
        assert p["rows"] == sum(map(len, totals))
        assert p["documents"] == len(LENGTHS)
        assert p["fill"] == pytest.approx(sum(LENGTHS) / p["computed_positions"])
        assert p["anchors"] is None  # a lengths file has no loss masks
        steps = len(plan[0]) // training.grad_accum_steps
        assert p["rows_per_optimizer_step"] == pytest.approx(p["rows"] / steps)


def test_unpacked_reports_have_no_packing_rows(run, lengths_file: Path) -> None:
    result = run(str(EXAMPLE), "--lengths", str(lengths_file), "--format", "json")
    report = json.loads(result.stdout)
    assert report["packing"] is None and "packing" not in report["pad_policy"]
    assert "packed rows" not in run(str(EXAMPLE), "--lengths", str(lengths_file)).stdout


def test_text_shows_the_packed_rows(run, lengths_file: Path) -> None:
    result = run(str(EXAMPLE), "--lengths", str(lengths_file), *PACKED)
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert "pad policy  packed rows of 2048 (last rows: buckets 512, 1024, 1536, 2048)" in out
    assert "packed rows (one epoch, all ranks; fill = real tokens / computed positions)" in out
    assert "packing + buckets (configured)" in out and "rows/step" in out


def test_packing_without_static_shapes_is_a_config_error(run, lengths_file: Path) -> None:
    result = run(
        str(EXAMPLE),
        "--lengths",
        str(lengths_file),
        *PACKED,
        "--set",
        "training.static_shapes=false",
        "--set",
        "training.static_shape_buckets=[]",
    )
    assert result.exit_code == 2
    assert "packing requires static_shapes" in result.stderr


def test_packing_counts_anchors_per_conversation_from_the_corpus(
    run, tiny_corpus_config: Path, tmp_path: Path
) -> None:
    from PIL import Image

    from specdraft.collate.packing_accounting import ROW_FILL_PLOT_KEY

    out = tmp_path / "packed.png"
    result = run(str(tiny_corpus_config), "--format", "json", *PACKED, "--plot", str(out))
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    packed = {p["name"]: p for p in report["packing"]}
    assert set(packed) == {"packing", "packing + buckets"}
    for p in packed.values():
        anchors = p["anchors"]
        assert anchors["valid_anchors"] > 0
        # num_anchors = 256 per row, shared by the row's conversations: never more than alone.
        assert (
            0 < anchors["anchors_per_conversation"] <= anchors["anchors_per_conversation_unpacked"]
        )
        assert p["documents"] == report["source"]["samples"]
    rows_png = tmp_path / "packed-rows.png"
    assert f"row fill plot written to {rows_png}" in result.stderr
    with Image.open(rows_png) as image:
        drawn = json.loads(image.text[ROW_FILL_PLOT_KEY])
    for name, p in packed.items():
        assert drawn["series"][name] == p["fill_histogram"]["rows"]
        assert sum(drawn["series"][name]) == p["rows"]
