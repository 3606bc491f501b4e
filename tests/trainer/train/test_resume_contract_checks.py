"""The trainer's fingerprint check reads a checkpoint through the resume contract's defaults:
a fingerprint from before a field existed resumes a run that leaves the option off, and is
refused, naming the field and the override, for a run that turns it on."""

from __future__ import annotations

from pathlib import Path

import pytest

from specdraft.config import load_config
from specdraft.trainer.train.assembly import run_fingerprint
from specdraft.trainer.train.checkpoint import CheckpointMismatch, check_fingerprint

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "qwen3-8b-dflash2-2048.toml"


def test_an_older_fingerprint_resumes_and_refuses_through_the_defaults(tmp_path: Path) -> None:
    older = run_fingerprint(load_config(EXAMPLE), "d")
    assert "training.packing" not in older and "data.anchor_grouped" not in older
    assert check_fingerprint(older, run_fingerprint(load_config(EXAMPLE), "d"), tmp_path) == []
    grouped = run_fingerprint(load_config(EXAMPLE, ["data.anchor_grouped=true"]), "d")
    with pytest.raises(CheckpointMismatch) as refused:
        check_fingerprint(older, grouped, tmp_path)
    message = str(refused.value)
    assert "data.anchor_grouped: checkpoint has False, config has True" in message
    assert "--allow-changed data.anchor_grouped" in message
    changes = check_fingerprint(older, grouped, tmp_path, allow_changed=("data.anchor_grouped",))
    assert changes == ["data.anchor_grouped: checkpoint has False, config has True"]


def test_identity_fields_are_refused_even_when_data_order_is_allowed(tmp_path: Path) -> None:
    saved = run_fingerprint(load_config(EXAMPLE), "d")
    other = run_fingerprint(load_config(EXAMPLE, ["model.block_size=8"]), "d")
    with pytest.raises(CheckpointMismatch, match="block_size: checkpoint has 16, config has 8"):
        check_fingerprint(saved, other, tmp_path, allow_changed=("training.seed",))


def test_a_resume_on_other_labels_is_refused_naming_them(tmp_path: Path) -> None:
    saved = run_fingerprint(load_config(EXAMPLE), "d")
    argmax = run_fingerprint(load_config(EXAMPLE, ['data.labels="target_argmax"']), "d")
    with pytest.raises(CheckpointMismatch, match=r"data\.labels: checkpoint has 'tokens', config"):
        check_fingerprint(saved, argmax, tmp_path, allow_changed=("training.seed",))
    soft = ["training.soft_label_topk=8", "training.soft_label_weight=0.5"]
    with pytest.raises(CheckpointMismatch, match=r"training\.soft_label_topk: checkpoint has 0"):
        check_fingerprint(saved, run_fingerprint(load_config(EXAMPLE, soft), "d"), tmp_path)
    # The soft labels' weight may change on resume, as the learning rate may.
    lighter = run_fingerprint(
        load_config(EXAMPLE, [*soft[:1], "training.soft_label_weight=0.2"]), "d"
    )
    saved_soft = run_fingerprint(load_config(EXAMPLE, soft), "d")
    assert check_fingerprint(saved_soft, lighter, tmp_path) == []


def test_a_resume_under_another_attention_window_is_refused(tmp_path: Path) -> None:
    # Weights trained with full attention (a checkpoint from before the option) or one window
    # are another draft under another window: refused, naming the field.
    full = run_fingerprint(load_config(EXAMPLE), "d")
    slid = run_fingerprint(load_config(EXAMPLE, ["model.sliding_window=512"]), "d")
    with pytest.raises(CheckpointMismatch, match=r"model\.layer_windows: checkpoint has None"):
        check_fingerprint(full, slid, tmp_path, allow_changed=("training.seed",))
    wider = run_fingerprint(load_config(EXAMPLE, ["model.sliding_window=1024"]), "d")
    with pytest.raises(CheckpointMismatch, match=r"model\.layer_windows: checkpoint has \[512"):
        check_fingerprint(slid, wider, tmp_path)
    assert check_fingerprint(slid, slid, tmp_path) == []
