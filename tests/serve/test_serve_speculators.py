"""Every family's `--format speculators` export loads in speculators 0.9.0's own model classes
(build/speculators-venv), and their forward equals specdraft's in fp32 (1e-5): the draft hidden
states and logits of every block slot, DFlash2's selector scores and DSpark's Markov bias and
confidence logits; with a draft vocabulary (DFlash, DSpark) too, its head read from the export
and its t2d / d2t from the export's buffers."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from serve_support import ROOT, specdraft_cli, speculators_python

pytestmark = [pytest.mark.serve, pytest.mark.slow, pytest.mark.timeout(1800)]

FORWARD = ROOT / "tests" / "support" / "speculators_forward.py"
ANCHORS = torch.tensor([2, 9, 15])
LENGTH = 24


def specdraft_outputs(checkpoint: Path, target: Path, inputs: dict) -> dict:
    """specdraft's draft on the same inputs: what speculators_forward.py writes for speculators."""
    from specdraft.trainer.export import load_checkpoint_draft
    from specdraft.trainer.models import load_target_head

    model = load_checkpoint_draft(checkpoint).eval()
    head = load_target_head(target, dtype=torch.float32)
    anchors = ANCHORS[None]
    with torch.no_grad():
        hidden = model.run_backbone(
            inputs["input_ids"],
            inputs["hidden_states"],
            anchors,
            torch.ones_like(anchors, dtype=torch.bool),
            head,
            "sdpa",
        )[0]
        out = {"hidden": hidden, "logits": model.vocab_logits(hidden, head)}
        block = model.block_size
        tokens = inputs["input_ids"][0, (ANCHORS[:, None] + torch.arange(block)).flatten()]
        tokens = tokens.view(-1, block)
        if hasattr(model, "candidate_selector"):
            out["previous"] = torch.cat([tokens[:, :1], tokens[:, :-1]], dim=1)
        if hasattr(model, "markov_head"):
            out["markov_bias"] = model.markov_head.block_bias(hidden, tokens)
            if model.confidence_head is not None:
                out["confidence"] = model.confidence_head(hidden, model.markov_head.embed(tokens))
    return out


@pytest.mark.parametrize(
    ("family", "vocab"),
    [("dflash", None), ("dflash2", None), ("dspark", None), ("dflash", 512), ("dspark", 512)],
)
def test_speculators_loads_the_export_and_computes_specdraft_s_forward(
    family, vocab, request, tiny_target_path, tmp_path
):
    python = speculators_python()
    fixture = "family_checkpoints" if vocab is None else "vocab_checkpoints"
    checkpoint = request.getfixturevalue(fixture)[family]
    out = tmp_path / "speculators"
    done = specdraft_cli(
        *("export", str(checkpoint), "--out", str(out), "--format", "speculators"),
        *("--verifier", str(tiny_target_path), "--dtype", "float32"),
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]

    generator = torch.Generator().manual_seed(0)
    inputs = {
        "input_ids": torch.randint(0, 4000, (1, LENGTH), generator=generator),
        "hidden_states": torch.randn(1, LENGTH, 2 * 128, generator=generator),
        "last_hidden": torch.randn(1, LENGTH, 128, generator=generator),
        "anchors": ANCHORS,
    }
    save_file(inputs, str(tmp_path / "inputs.safetensors"))
    files = [out, tmp_path / "inputs.safetensors", tmp_path / "theirs.safetensors"]
    ran = subprocess.run(
        [str(python), str(FORWARD), *map(str, files)],
        capture_output=True,
        text=True,
        env={"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
        timeout=600,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    kind = {"dflash": "DFlashDraftModel", "dflash2": "DFlash2DraftModel"}.get(
        family, "DSparkDraftModel"
    )
    assert f"loaded {kind} ({family})" in ran.stdout
    theirs = load_file(str(tmp_path / "theirs.safetensors"))
    ours = specdraft_outputs(checkpoint, tiny_target_path, inputs)

    torch.testing.assert_close(theirs["hidden"], ours["hidden"], rtol=0, atol=1e-5)
    # Over the draft vocabulary when there is one: speculators' own head has its rows.
    assert theirs["logits"].shape[-1] == (vocab or ours["logits"].shape[-1])
    torch.testing.assert_close(theirs["logits"], ours["logits"], rtol=0, atol=1e-5)
    if family == "dflash2":
        from specdraft.trainer.export import load_checkpoint_draft

        selector = load_checkpoint_draft(checkpoint).candidate_selector
        candidates = theirs["candidates"]
        with torch.no_grad():
            scores = selector.score(
                ours["hidden"], ours["previous"], candidates, ours["logits"].gather(-1, candidates)
            )
        torch.testing.assert_close(theirs["selector_scores"], scores, rtol=0, atol=1e-5)
    if family == "dspark":
        torch.testing.assert_close(theirs["markov_bias"], ours["markov_bias"], rtol=0, atol=1e-5)
        torch.testing.assert_close(theirs["confidence"], ours["confidence"], rtol=0, atol=1e-5)
