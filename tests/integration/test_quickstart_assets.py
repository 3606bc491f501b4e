"""`specdraft assets tiny-target --out DIR`: the cached tiny target copied to a fixed path, once;
an older copy is replaced, a folder that is not a copy is never touched."""

from __future__ import annotations

import json

from click.testing import CliRunner

from specdraft.cli.assets_cmd import MARKER
from specdraft.cli.main import cli


def install(out):
    return CliRunner().invoke(cli, ["assets", "tiny-target", "--out", str(out)])


def test_the_tiny_target_is_copied_once_and_loads(tiny_target_path, tmp_path):
    from transformers import AutoConfig, AutoTokenizer

    out = tmp_path / "models" / "tiny-target"
    done = install(out)
    assert done.exit_code == 0, done.output
    assert f"tiny target {tiny_target_path.name}" in done.output
    for name in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (out / name).read_bytes() == (tiny_target_path / name).read_bytes()
    assert AutoConfig.from_pretrained(str(out)).num_hidden_layers == 4
    assert AutoTokenizer.from_pretrained(str(out)).chat_template

    stamp = (out / "model.safetensors").stat().st_mtime_ns
    again = install(out)
    assert again.exit_code == 0 and "up to date" in again.output
    assert (out / "model.safetensors").stat().st_mtime_ns == stamp


def test_an_older_copy_is_replaced_and_a_foreign_folder_refused(tiny_target_path, tmp_path):
    out = tmp_path / "tiny-target"
    out.mkdir()
    (out / MARKER).write_text(json.dumps({"source": "tiny-target-0000"}))
    (out / "stale.bin").write_text("old build")
    done = install(out)
    assert done.exit_code == 0, done.output
    assert not (out / "stale.bin").exists()
    assert json.loads((out / MARKER).read_text()) == {"source": tiny_target_path.name}

    foreign = tmp_path / "my-model"
    foreign.mkdir()
    (foreign / "weights.bin").write_text("precious")
    done = install(foreign)
    assert done.exit_code == 1
    assert "is not a tiny-target copy" in done.output
    assert (foreign / "weights.bin").read_text() == "precious"
