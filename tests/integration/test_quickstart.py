"""The quickstart: its config lints clean and agrees with the Makefile's steps, and a smaller
variant of it (fewer regenerated conversations, fewer steps) trains with a falling loss and a
higher tau after training than before."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from cli_support import specdraft_cli

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "quickstart.toml"


def quickstart_recipe() -> list[str]:
    """The commands of the Makefile's quickstart target, continuation lines joined."""
    text = (ROOT / "Makefile").read_text().replace("\\\n", " ")
    block = text.split("\nquickstart:", 1)[1]
    lines = []
    for line in block.splitlines()[1:]:
        if not line.startswith("\t"):
            break
        lines.append(" ".join(line.split()))
    return lines


def test_the_config_lints_clean_and_uses_what_the_makefile_writes():
    from specdraft.config import load_config
    from specdraft.config.lint import lint_file

    findings = lint_file(str(CONFIG))
    assert not [f for f in findings if f.severity in ("error", "warning")], findings
    config = load_config(CONFIG)
    recipe = quickstart_recipe()
    outs = [re.search(r"--out (\S+)", line).group(1) for line in recipe if " regenerate " in line]
    assert config.data.train_paths == [outs[0]]
    assert config.data.eval_paths == [outs[1]]
    assert any(f"--out {config.model.target}" in line for line in recipe if " assets " in line)
    assert any(f"rm -rf {config.output_dir}" in line for line in recipe)
    assert recipe[-1].endswith("specdraft train examples/quickstart.toml")
    # Train and eval conversations come from separate ranges of the package.
    ranges = [
        tuple(int(x) for x in re.search(r"--first (\d+) --count (\d+)", line).groups())
        for line in recipe
        if " regenerate " in line
    ]
    (first_a, count_a), (first_b, _) = ranges
    assert first_a + count_a <= first_b
    # Every path is relative to the repository root, where the Makefile runs.
    for path in [config.model.target, config.output_dir, *outs]:
        assert not Path(path).is_absolute()


def specdraft(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return specdraft_cli(*args, cwd=cwd, timeout=600)


@pytest.mark.slow
def test_a_smaller_quickstart_trains_and_raises_tau(tiny_target_path, tmp_path):
    data = tmp_path / "data"
    target = ["--set", f'model.target="{tiny_target_path}"']
    regenerate = ["regenerate", str(CONFIG), "--source", "pkg:sharegpt", "--no-progress"]
    for name, first, count in (("train", 0, 60), ("eval", 10000, 10)):
        done = specdraft(
            *regenerate,
            *target,
            *("--out", str(data / f"{name}.jsonl"), "--first", str(first)),
            *("--count", str(count), "--max-new-tokens", "96", "--batch-size", "32"),
            cwd=tmp_path,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    overrides = [
        *target,
        *("--set", f'output_dir="{tmp_path / "run"}"'),
        *("--set", f'data.train_paths=["{data / "train.jsonl"}"]'),
        *("--set", f'data.eval_paths=["{data / "eval.jsonl"}"]'),
        *("--set", "data.max_eval_samples=8"),
        # Fewer conversations: more passes at a higher rate, so that tau still clearly rises.
        *("--set", "training.num_epochs=5"),
        *("--set", "training.learning_rate=6e-3"),
    ]
    done = specdraft("train", str(CONFIG), *overrides, "--no-progress", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]

    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["last_loss"] < 0.8 * summary["first_loss"]
    before, after = summary["evals"][0], summary["evals"][-1]
    assert before["step"] == 0 and after["step"] == summary["final_step"]
    assert after["tau"] > before["tau"] + 0.5
    line = re.search(r"tau before -> after training: ([\d.]+) -> ([\d.]+)", done.stdout)
    assert line is not None, done.stdout[-2000:]
    assert float(line.group(1)) == pytest.approx(before["tau"], abs=0.005)
    assert float(line.group(2)) == pytest.approx(after["tau"], abs=0.005)
    assert re.search(r"loss: [\d.]+ -> [\d.]+ over \d+ steps", done.stdout)
