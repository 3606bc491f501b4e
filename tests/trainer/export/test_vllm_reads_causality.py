"""vLLM's own code reads each `model.causal_layers` setting of a `--format vllm` export as the
draft was trained: the per-layer causality of `qwen3_dflash._dflash_layer_causal` and the windows
of `_resolve_layer_attention`, equal to the draft's `layer_causal()` and `layer_windows()`, for
full, sliding and mixed layers (one vLLM child reads every folder)."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch
from serve_support import ROOT, vllm_python

from specdraft.trainer.export.options import ExportOptions
from specdraft.trainer.export.vllm import write_vllm
from specdraft.trainer.models import build_draft, load_target_config

pytestmark = [pytest.mark.serve, pytest.mark.slow, pytest.mark.subprocess]

MIXED = ["sliding_attention", "full_attention"]
CASES = {
    "full-none": {},
    "full-all": {"causal_layers": "all"},
    "sliding-none": {"sliding_window": 8},
    "sliding-all": {"sliding_window": 8, "causal_layers": "all"},
    "sliding-sliding": {"sliding_window": 8, "causal_layers": "sliding"},
    "mixed-none": {"sliding_window": 8, "layer_types": MIXED},
    "mixed-all": {"sliding_window": 8, "layer_types": MIXED, "causal_layers": "all"},
    "mixed-sliding": {"sliding_window": 8, "layer_types": MIXED, "causal_layers": "sliding"},
}


def test_vllm_reads_every_causal_layers_setting_as_trained(draft_model_config, tmp_path):
    drafts, folders = [], []
    for name, attention in CASES.items():
        cfg = draft_model_config("dflash", **attention)
        draft = build_draft(cfg, load_target_config(cfg.target), dtype=torch.float32)
        folder = tmp_path / name
        write_vllm(draft, folder, ExportOptions(checkpoint=name))
        drafts.append(draft)
        folders.append(str(folder))
    done = subprocess.run(
        [
            str(vllm_python()),
            str(ROOT / "tests" / "support" / "vllm_causality_check.py"),
            json.dumps(folders),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    read = json.loads(done.stdout.strip().splitlines()[-1])
    for name, draft, seen in zip(CASES, drafts, read, strict=True):
        assert tuple(seen["causal"]) == draft.config.layer_causal(), name
        if seen["windows"] is not None:
            assert tuple(seen["windows"]) == draft.config.layer_windows(), name
    # The mixed "sliding" draft states no causality: vLLM's default for its layer_types.
    mixed = json.loads((tmp_path / "mixed-sliding" / "config.json").read_text())
    assert "is_causal" not in mixed and "causal" not in mixed["dflash_config"]
    assert read[-1]["causal"] == [True, False]
