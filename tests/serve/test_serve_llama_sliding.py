"""A sliding-window draft trained one step and exported for llama.cpp build 11434: the GGUF that
llama.cpp's converter writes carries the window, the per-layer pattern and the blocks'
causality (bidirectional for the DFlash draft, `model.causal_layers = "all"` for the DSpark one)
and the DFlash draft's attention sinks (`attn_sinks`), the keys and tensors dflash.cpp builds its
SWA cache and attention from. (llama-server serving it is not run.)"""

from __future__ import annotations

import pytest
from serve_support import gguf_contents, llama_cpp_build

pytestmark = [
    pytest.mark.serve,
    pytest.mark.slow,
    pytest.mark.subprocess,
    pytest.mark.timeout(1800),
]


@pytest.mark.parametrize("family", ["dflash", "dspark"])
def test_a_sliding_draft_s_gguf_carries_the_window_and_its_layers(
    family, tiny_target_path, tmp_path
):
    from test_serve_llama_gguf import one_step

    from specdraft.trainer.export import export_checkpoint

    llama = llama_cpp_build()
    model = {
        "algorithm": family,
        "num_draft_layers": 2,
        "sliding_window": 32,
        "layer_types": ["sliding_attention", "full_attention"],
    }
    if family == "dspark":
        model["dspark"] = {"confidence_uses_markov": True}
        model["causal_layers"] = "all"
    else:
        model["attention_sink_bias"] = True
    checkpoint = one_step(tiny_target_path, tmp_path / "run", **model)
    out = tmp_path / "draft.gguf"
    export_checkpoint(
        checkpoint, out, format="gguf", verifier=str(tiny_target_path), dtype="float32"
    )
    contents = gguf_contents(llama, out)
    keys, tensors = contents["keys"], contents["tensors"]
    arch = keys["general.architecture"][1]
    assert keys[f"{arch}.attention.sliding_window"][1] == 32, sorted(keys)
    assert keys[f"{arch}.attention.sliding_window_pattern"][1] == [True, False]
    assert keys[f"{arch}.attention.causal"][1] is (family == "dspark")
    # The DFlash draft's sink logits: dflash.cpp's per-layer attn_sinks, one per head.
    sinks = sorted(name for name in tensors if "attn_sinks" in name)
    if family == "dflash":
        assert sinks == ["blk.0.attn_sinks.weight", "blk.1.attn_sinks.weight"], sorted(tensors)
        assert tensors["blk.0.attn_sinks.weight"][1] == [keys[f"{arch}.attention.head_count"][1]]
    else:
        assert sinks == []
