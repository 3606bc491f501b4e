"""`specdraft assets gguf|smollm2` refuse what they cannot use before building anything: a --out
folder that is not a copy of a GGUF target, and a --gguf file that is not GGUF. (The builds and
copies themselves are tested with the real SmolLM2 file in tests/trainer/assets.)"""

from __future__ import annotations

import json

from click.testing import CliRunner

from specdraft.cli.assets_cmd import MARKER
from specdraft.cli.main import cli


def test_a_foreign_out_folder_is_refused_before_any_build(tmp_path):
    foreign = tmp_path / "my-model"
    foreign.mkdir()
    (foreign / "weights.bin").write_text("precious")
    tiny_copy = tmp_path / "tiny-target"
    tiny_copy.mkdir()
    (tiny_copy / MARKER).write_text(json.dumps({"source": "tiny-target-0000"}))
    cache = tmp_path / "cache"
    for out in (foreign, tiny_copy):  # a tiny-target copy is not a GGUF target's to replace
        args = ["assets", "smollm2", "--out", str(out), "--cache-dir", str(cache)]
        done = CliRunner().invoke(cli, args)
        assert done.exit_code == 1, done.output
        assert f"--out {out} exists and is not a gguf-target copy" in done.output
    assert (foreign / "weights.bin").read_text() == "precious"
    assert not cache.exists()  # nothing downloaded or built


def test_a_file_that_is_not_gguf_is_refused_by_name(tmp_path):
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"\x00" * 64)
    args = ["assets", "gguf", "--gguf", str(weights), "--out", str(tmp_path / "out")]
    done = CliRunner().invoke(cli, [*args, "--cache-dir", str(tmp_path / "cache")])
    assert done.exit_code == 1, done.output
    assert f"{weights} is not a GGUF file" in done.output
    assert not (tmp_path / "out").exists()


def test_assets_help_lists_the_targets():
    done = CliRunner().invoke(cli, ["assets", "--help"])
    assert done.exit_code == 0
    for name in ("tiny-target", "gguf", "smollm2"):
        assert name in done.output
    done = CliRunner().invoke(cli, ["assets", "gguf", "--help"])
    assert "--gguf FILE" in done.output and "specdraft-trainer[gguf]" in done.output
