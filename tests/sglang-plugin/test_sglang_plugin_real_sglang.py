"""The feature-store hook of the specdraft SGLang plugin against SGLang 0.5.23's own code, in
build/sglang-venv: the hooked method's name and signature, its call site and every field the
hook reads, checked on SGLang's source (its scheduler modules do not import on this machine),
so a new SGLang that changes them fails here; then SGLang's own plugin loader and HookRegistry
register and apply the hooks over SGLang's own method (compiled from its source), and a plugin
told it runs on another SGLang refuses to load, naming both versions."""

from __future__ import annotations

import ast
import json
import subprocess
from pathlib import Path

import pytest
import torch
from sglang_venv import ROOT, build_sglang_python, sglang_source_path

from specdraft.trainer.disagg.store.local import LocalFeatureStore
from specdraft.trainer.disagg.store.tensors import tensors_to_store
from specdraft.trainer.disagg.wire import CaptureRequest, capture_spec
from specdraft.trainer.disagg.wire.sglang import PLUGIN_TENSORS, PluginSettings
from specdraft.trainer.disagg.wire.sglang import write_plugin_settings as write_settings

# Every test here runs SGLang's own code in its venv (build/sglang-venv, built by `make test`).
pytestmark = pytest.mark.sglang

CHECK = ROOT / "tests" / "support" / "sglang_plugin_check.py"
HOOKED = ["req", "logits_output", "hidden_state_offset", "capture_hidden_mode", "extend_input_len"]


@pytest.fixture(scope="module")
def sglang_python() -> str:
    return build_sglang_python()


def _tree(python: str, relative: str) -> ast.Module:
    return ast.parse(sglang_source_path(python, relative).read_text())


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name]
    return node


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    (node,) = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name]
    return node


def _self_fields(cls: ast.ClassDef) -> set[str]:
    """Attributes a class sets on self anywhere in its body, plus its annotated fields."""
    names = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)}
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        for t in targets:
            if (
                isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)
                and t.value.id == "self"
            ):
                names.add(t.attr)
    return names


def test_the_hooked_method_its_call_site_and_the_fields_it_reads_are_sglangs(sglang_python):
    from specdraft_sglang_plugin import BUILT_FOR_SGLANG
    from specdraft_sglang_plugin.feature_store import FEATURES_TARGET

    assert BUILT_FOR_SGLANG == "0.5.23"
    module, cls_name, method_name = FEATURES_TARGET.rsplit(".", 2)
    relative = module.removeprefix("sglang.srt.").replace(".", "/") + ".py"
    tree = _tree(sglang_python, relative)
    processor = _class(tree, cls_name)
    method = _method(processor, method_name)
    # The hook takes these by keyword: any rename, reorder to positional or new field fails.
    assert [a.arg for a in method.args.args] == ["self"]
    assert [a.arg for a in method.args.kwonlyargs] == [*HOOKED, "store"]
    assert isinstance(method.args.kw_defaults[-1], ast.Constant)
    assert method.args.kw_defaults[-1].value is True
    # The rows it slices: logits_output.hidden_states[start:hidden_state_offset], full mode only.
    body = ast.unparse(method)
    assert "logits_output.hidden_states[start:hidden_state_offset]" in body
    assert "capture_hidden_mode.is_full()" in body
    assert "req.hidden_states.append(" in body
    # Every call passes keywords only, and `store` is False exactly for uncommitted chunks.
    calls = [
        n
        for n in ast.walk(processor)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == method_name
    ]
    assert calls and all(not c.args for c in calls)
    for call in calls:
        assert {k.arg for k in call.keywords} == {*HOOKED, "store"}
    prefill = ast.unparse(_method(processor, "process_batch_result_prefill"))
    assert "and req.inflight_middle_chunks <= 0" in prefill  # a middle chunk does not store
    assert "req.inflight_middle_chunks -= 1" in prefill  # ...and is counted down after us
    assert "req.output_ids.append(next_token_id)" in prefill
    assert "req.update_finish_state()" in prefill  # which turns our to_finish into the finish

    batch = _tree(sglang_python, "managers/schedule_batch.py")
    req = _class(batch, "Req")
    used = {
        "rid",
        "origin_input_ids",
        "return_hidden_states",
        "hidden_states",
        "inflight_middle_chunks",
        "is_retracted",
        "to_finish",
    }
    assert used <= _self_fields(req), used - _self_fields(req)
    assert _method(req, "finished")
    finish = ast.unparse(_method(req, "update_finish_state"))
    assert "self.finished_reason = self.to_finish" in finish
    abort = _method(_class(batch, "FINISH_ABORT"), "__init__")
    assert [a.arg for a in abort.args.args][:3] == ["self", "message", "status_code"]

    # The reference reaches meta_info: the output streamer keeps hidden_states[:finished_len],
    # the tokenizer manager puts the request's list in meta_info["hidden_states"].
    streamer = sglang_source_path(
        sglang_python, "managers/scheduler_components/output_streamer.py"
    ).read_text()
    assert "hs = hs[: req.finished_len]" in streamer
    manager = sglang_source_path(sglang_python, "managers/tokenizer_manager.py").read_text()
    assert 'meta_info["hidden_states"] = hidden_states' in manager
    assert "raise fastapi.HTTPException(" in manager  # an abort with a status: an HTTP error
    # One writer per request: rank 0 of the attention-TP group, as the output streamer.
    context = sglang_source_path(sglang_python, "runtime_context.py").read_text()
    assert "def get_parallel()" in context and '"attn_tp_rank"' in context
    assert "get_parallel().attn_tp_rank == 0" in streamer


def _settings(tmp_path: Path) -> tuple[Path, PluginSettings]:
    settings = PluginSettings(
        run_id="run1",
        secret="ab" * 32,
        layer_ids=(5, 1),
        hidden_size=4,
        with_last_hidden=False,
        dtype="bfloat16",
        store="local",
        run_dir=str(tmp_path / "run"),
    )
    return write_settings(tmp_path / "capture.json", settings), settings


def _run_check(python: str, mode: str, tmp_path: Path, rows: torch.Tensor) -> dict:
    path, _ = _settings(tmp_path)
    torch.save(rows, tmp_path / "rows.pt")
    done = subprocess.run(
        [python, str(CHECK), mode, str(tmp_path / "rows.pt")],
        env={"SPECDRAFT_SGLANG_CAPTURE": str(path), "PATH": "/usr/bin:/bin"},
        cwd=CHECK.parent,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_sglangs_loader_applies_the_hooks_over_sglangs_own_method(sglang_python, tmp_path):
    from specdraft_sglang_plugin import TARGET
    from specdraft_sglang_plugin.feature_store import FEATURES_TARGET

    torch.manual_seed(0)
    # Rows as SGLang hands them over: the layers ascending (1, 5), then the final state.
    rows = torch.randn(10, 3 * 4).to(torch.bfloat16)
    report = _run_check(sglang_python, "hooks", tmp_path, rows)
    assert [TARGET, "specdraft_sglang_plugin.append_final_state", "after"] in report["hooks"]
    hook = "specdraft_sglang_plugin.feature_store.capture_prefill_rows"
    assert [FEATURES_TARGET, hook, "around"] in report["hooks"]
    assert report["patched"] and f"Applied 1 hook(s) to {FEATURES_TARGET}" in report["log"]
    assert report["final_state_width"] == 6
    # Three chunks of a specdraft request: one reference, the features in the store...
    (ref,) = report["chunked"]["hidden_states"]
    assert report["chunked"]["abort"] is None
    assert ref["specdraft_features"] == 1 and ref["seq_len"] == 10
    # ...byte for byte what the embedded capture server writes for the same features.
    expected_store = LocalFeatureStore(tmp_path / "expected")
    request = CaptureRequest("run1", 3, 1, list(range(10)), [1] * 10)
    spec = capture_spec((5, 1), 4, algorithm="dflash2")
    hidden = torch.cat([rows[:, 4:8], rows[:, 0:4]], dim=-1)  # config order: 5, then 1
    expected = tensors_to_store(
        expected_store, request, spec, {"hidden_states": hidden}, names=PLUGIN_TENSORS
    )
    got_store = LocalFeatureStore(tmp_path / "run" / "feature-store")
    assert ref["tensors"] == [
        {"name": t.name, "key": t.key, "shape": list(t.shape), "dtype": t.dtype}
        for t in expected.tensors
    ]
    for meta in expected.tensors:
        assert got_store.get(meta.key) == expected_store.get(meta.key)
    # A request that is not specdraft's gets stock SGLang's answer, from SGLang's own code.
    assert report["foreign_equal"] and report["foreign"]["abort"] is None


def test_a_plugin_built_for_another_sglang_refuses_to_load_naming_both(sglang_python, tmp_path):
    report = _run_check(sglang_python, "wrong-version", tmp_path, torch.zeros(2, 8))
    assert report["hooks"] == []  # nothing hooked, SGLang serves as stock
    assert "Failed to execute general plugin: specdraft_final_state" in report["log"]
    assert "built for SGLang 0.5.23 and refuses to hook SGLang 0.5.24" in report["log"]
