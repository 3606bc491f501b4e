"""The managed SGLang launcher against the REAL SGLang 0.5.23 argument parser, validation hook
and plugin registry, run in build/sglang-venv (created on demand by scripts/sglang_venv.sh:
sglang==0.5.23 --no-deps on top of this interpreter's CPU torch and packages). A venv that
cannot be created fails these tests: they are the only check that the command we launch is one
SGLang accepts."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from sglang_stub import check_capture_args
from sglang_venv import build_sglang_python

from specdraft.config import load_config
from specdraft.trainer.disagg.capture.sglang_launcher import (
    SGLangInterfaceError,
    detect_sglang_interface,
    interface_from_fields,
    sglang_command,
)

# Every test here runs SGLang's own code in its venv (build/sglang-venv, built by `make test`).
pytestmark = pytest.mark.sglang

ROOT = Path(__file__).resolve().parents[4]
CHECK = ROOT / "tests" / "support" / "sglang_real_check.py"
EXAMPLES = {
    "dflash2": ROOT / "examples" / "qwen3-8b-dflash2-8192.toml",
    "dspark": ROOT / "examples" / "qwen3-8b-dspark-8192.toml",
}
sys.path.insert(0, str(ROOT / "packages" / "sglang-plugin" / "src"))


@pytest.fixture(scope="session")
def sglang_python() -> str:
    """build/sglang-venv's python, the venv built (or found up to date) by the repo's script."""
    return build_sglang_python()


def real_verdicts(python: str, argvs: list[list[str]]) -> list[dict]:
    """SGLang 0.5.23's verdicts (prepare_server_args + handle_aux_hidden_state_capture)."""
    done = subprocess.run(
        [python, str(CHECK)],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def stub_verdict(argv: list[str]) -> dict:
    """The stub's verdict on the same argv (it emulates 0.5.23 by default)."""
    try:
        check_capture_args(argv, "0.5.23")
    except ValueError as exc:
        return {"ok": False, "error": str(exc)}
    return {"ok": True, "error": ""}


def launch_argv(algorithm: str, *, python: str | None = None, interface: str | None = None):
    """What the launcher passes to `python -m sglang.launch_server` for an example config."""
    cfg = load_config(EXAMPLES[algorithm], ["deployment.disaggregated.capture='sglang'"])
    cmd = sglang_command(cfg, port=31000, python=python, interface=interface)
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    return cmd[3:]


def _without(argv: list[str], flag: str) -> list[str]:
    """argv less `flag` and the values that follow it."""
    i = argv.index(flag)
    j = i + 1
    while j < len(argv) and not argv[j].startswith("--"):
        j += 1
    return argv[:i] + argv[j:]


def test_the_launch_commands_pass_sglang_and_the_stub_gives_the_same_verdicts(sglang_python):
    # interface=None: the launcher asks the venv's SGLang which flags it has.
    good = {name: launch_argv(name, python=sglang_python) for name in EXAMPLES}
    assert "--return-aux-hidden-state-layer-ids" in good["dflash2"]
    base = good["dspark"]
    cases = {
        "dflash2": good["dflash2"],
        "dspark": base,
        "no layer ids": _without(base, "--return-aux-hidden-state-layer-ids"),
        "a draft path": [*base, "--speculative-draft-model-path", "/models/draft"],
        "repeated ids": [*base, "--return-aux-hidden-state-layer-ids", "1", "9", "9"],
        "negative id": [*base, "--return-aux-hidden-state-layer-ids", "-1", "9"],
        "ids without capture": _without(base, "--enable-return-aux-hidden-states"),
        "no algorithm": _without(base, "--speculative-algorithm"),
        "pipeline parallel": [*base, "--pp-size", "2"],
        "the later interface": launch_argv("dspark", interface="aux-capture"),
    }
    real = dict(zip(cases, real_verdicts(sglang_python, list(cases.values())), strict=True))
    assert real["dflash2"]["ok"] and real["dspark"]["ok"], real
    for name in cases:
        if name not in ("dflash2", "dspark"):
            assert not real[name]["ok"], (name, real[name])
    assert "requires --return-aux-hidden-state-layer-ids" in real["no layer ids"]["error"]
    assert "drop --speculative-draft-model-path" in real["a draft path"]["error"]
    assert "must not repeat a layer" in real["repeated ids"]["error"]
    # The stub refuses exactly what SGLang refuses, so tests on the stub cannot drift again.
    stub = {name: stub_verdict(argv) for name, argv in cases.items()}
    assert {n: v["ok"] for n, v in stub.items()} == {n: v["ok"] for n, v in real.items()}


def test_the_interface_is_detected_from_the_installed_sglang(sglang_python, tmp_path):
    assert detect_sglang_interface(sglang_python) == "0.5.23"
    # A later SGLang: a ServerArgs dataclass with the renamed fields only.
    package = tmp_path / "newsglang"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "server_args.py").write_text(
        "import dataclasses\n"
        "@dataclasses.dataclass\n"
        "class ServerArgs:\n"
        "    model_path: str = ''\n"
        "    aux_hidden_state_capture: str | None = None\n"
        "    aux_hidden_state_layer_ids: list | None = None\n"
    )
    env = {"PYTHONPATH": str(tmp_path)}
    detected = detect_sglang_interface(server_args_module="newsglang.server_args", env=env)
    assert detected == "aux-capture"
    argv = launch_argv("dspark", interface=detected)
    at = argv.index("--aux-hidden-state-capture")
    assert argv[at : at + 3] == [
        "--aux-hidden-state-capture",
        "dspark",
        "--aux-hidden-state-layer-ids",
    ]
    assert "--speculative-algorithm" not in argv  # the later SGLang refuses combining them
    # And a Python without SGLang is an error that names the fix.
    with pytest.raises(SGLangInterfaceError, match="sglang_interface"):
        detect_sglang_interface(server_args_module="no_such_sglang.server_args")
    with pytest.raises(SGLangInterfaceError, match=r"install sglang>=0\.5\.23"):
        interface_from_fields(["model_path"])


def test_a_forced_interface_skips_detection(tmp_path):
    cfg = load_config(
        EXAMPLES["dflash2"],
        [
            "deployment.disaggregated.capture='sglang'",
            "deployment.disaggregated.sglang_interface='aux-capture'",
        ],
    )
    # The python named does not exist: a forced interface never runs it.
    cmd = sglang_command(cfg, port=1, python=str(tmp_path / "missing-python"))
    assert "--aux-hidden-state-capture" in cmd and "dflash" in cmd


# --------------------------------------------------------------------------- the plugin

PLUGIN_PROBE = """
import json
from sglang.srt.plugins import GENERAL_PLUGINS_GROUP, load_plugins_by_group
from sglang.srt.plugins.hook_registry import HookRegistry, HookType
found = load_plugins_by_group(GENERAL_PLUGINS_GROUP)
func, dist = found["specdraft_final_state"]
func()
hooks = [(t, h.__module__ + "." + h.__name__, kind.value) for t, hs in HookRegistry._hooks.items()
         for kind, h, _ in hs]
print(json.dumps({"dist": dist, "hooks": hooks}))
"""


def test_sglang_discovers_the_plugin_and_it_hooks_the_logits_output(sglang_python):
    from specdraft_sglang_plugin import TARGET

    done = subprocess.run(
        [sglang_python, "-c", PLUGIN_PROBE], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found["dist"] == "specdraft-sglang-plugin"
    assert [TARGET, "specdraft_sglang_plugin.append_final_state", "after"] in found["hooks"]
    # The hooked method and both fields it reads exist in 0.5.23's source (importing the
    # module itself needs GPU kernels, so it is read, not imported).
    site = Path(sglang_python).parents[1] / "lib"
    source = next(site.glob("python3*/site-packages/sglang/srt/layers/logits_processor.py"))
    tree = ast.parse(source.read_text())
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    fields = {
        n.target.id for n in classes["LogitsProcessorOutput"].body if isinstance(n, ast.AnnAssign)
    }
    assert {"hidden_states", "last_hidden_states"} <= fields
    assert any(
        isinstance(n, ast.FunctionDef) and n.name == "forward"
        for n in classes["LogitsProcessor"].body
    )


def test_the_plugin_appends_the_final_state_after_the_tapped_layers():
    from specdraft_sglang_plugin import append_final_state

    from specdraft.trainer.disagg.capture.sglang_client import split_sglang_hidden
    from specdraft.trainer.disagg.wire import CaptureRequest, capture_spec

    tokens, width, layers = 5, 4, (9, 1)
    aux = torch.arange(tokens * width * 2, dtype=torch.bfloat16).reshape(tokens, 2 * width)
    last = -torch.arange(tokens * width, dtype=torch.float32).reshape(tokens, width)
    out = append_final_state(SimpleNamespace(hidden_states=aux, last_hidden_states=last))
    assert out.hidden_states.shape == (tokens, 3 * width)
    assert out.hidden_states.dtype == torch.bfloat16
    # What the scheduler would send for one request (its prefill rows as lists), read back by
    # the capture client: tapped layers in config order, then the final state.
    request = CaptureRequest("run", 0, 0, list(range(tokens)), [1] * tokens)
    body = {"meta_info": {"hidden_states": [out.hidden_states.float().tolist()]}}
    hidden, final = split_sglang_hidden(
        body, request, capture_spec(layers, width, algorithm="dspark")
    )
    torch.testing.assert_close(final, last)
    torch.testing.assert_close(hidden[:, :width], aux[:, width:].float())  # layer 9 first
    # Nothing to append (no aux capture, or only some rows captured): left alone.
    plain = SimpleNamespace(hidden_states=aux, last_hidden_states=None)
    assert append_final_state(plain) is None and plain.hidden_states is aux
    partial = SimpleNamespace(hidden_states=aux[:2], last_hidden_states=last)
    assert append_final_state(partial) is None


# --------------------------------------------------------------------------- the torch range


def test_the_torch_range_admits_the_dev_build_sglangs_and_the_oldest_api_release():
    import tomllib

    from packaging.requirements import Requirement

    def torch_range(package: str):
        data = tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())
        (req,) = [Requirement(r) for r in data["project"]["dependencies"] if r.startswith("torch")]
        return req.specifier

    trainer = torch_range("trainer")
    # The CPU build development runs on, sglang==0.5.23's pin, and a newer GPU image's build.
    for version in ("2.13.0", "2.14.1", "2.15.0"):
        assert trainer.contains(version), (version, trainer)
    # 2.6 lacks torch._dynamo.config.recompile_limit, which the compile plan sets.
    assert not trainer.contains("2.6.0")
    assert trainer.contains("2.7.0")
    assert hasattr(torch._dynamo.config, "recompile_limit")
    assert torch_range("collate").contains("2.14.1")
    extras = tomllib.loads((ROOT / "packages/trainer/pyproject.toml").read_text())["project"]
    (sglang,) = [Requirement(r) for r in extras["optional-dependencies"]["sglang"]]
    assert sglang.specifier.contains("0.5.23")


# ------------------------------------------------ draft slots: SGLang's workers vs specdraft
# Read in SGLang 0.5.23 (speculative/): DFLASH builds a block [anchor | masks] of block_size
# query rows and takes the k-th draft token from row k ("draft tokens are block positions 1:
# (pos 0 is the seeded bonus token)", dflash_worker_v2.py). DSPARK with `sample_from_anchor`
# (the draft config's key, default True, which specdraft's export leaves unset) uses every
# query row, the anchor's first: the k-th token from row k-1; only `sample_from_anchor =
# false` drops row 0 (select_draft_hidden_without_anchor, dspark_draft.py).


def _sglang_source(python: str, relative: str) -> str:
    site = Path(python).parents[1] / "lib"
    return next(site.glob(f"python3*/site-packages/sglang/srt/{relative}")).read_text()


def test_sglang_reads_the_draft_slots_specdraft_proposes_from(sglang_python, draft_model_config):
    from specdraft.trainer.models import build_draft, load_target_config, load_target_head

    dflash = _sglang_source(sglang_python, "speculative/dflash_worker_v2.py")
    assert "hidden_states.view(bs, self.block_size, -1)[:, 1:, :]" in dflash
    dspark_cfg = _sglang_source(sglang_python, "speculative/dspark_components/dspark_config.py")
    assert '_cfg_get(draft_hf_config, "sample_from_anchor", True)' in dspark_cfg
    dspark = _sglang_source(sglang_python, "speculative/dspark_components/dspark_draft.py")
    assert "raw_hidden.view(bs, gamma, -1)" in dspark  # sample_from_anchor: all rows, in order
    assert "hidden_by_query[:, 1:]" in dspark  # only without sample_from_anchor

    for algorithm, read in (("dflash2", range(1, 4)), ("dspark", range(0, 3))):
        torch.manual_seed(0)
        cfg = draft_model_config(algorithm, block_size=4)
        draft = build_draft(cfg, load_target_config(cfg.target), dtype=torch.float32)
        assert "sample_from_anchor" not in draft.config.to_dict()  # SGLang's default applies
        head = load_target_head(cfg.target, torch.float32)
        hidden = torch.randn(2, 3, 4, draft.config.hidden_size)
        anchors = torch.randint(0, 100, (2, 3))
        with torch.no_grad():
            base = draft.greedy_tokens(hidden, anchors, head)
            for slot in range(4):
                moved = hidden.clone()
                moved[:, :, slot] = torch.randn_like(moved[:, :, slot]) * 50
                changed = draft.greedy_tokens(moved, anchors, head) != base
                if slot not in read:
                    # A row SGLang does not read must not change a proposal.
                    assert not changed.any(), (algorithm, slot)
                else:
                    # The row SGLang reads for the k-th token decides it (k = position in read).
                    k = list(read).index(slot)
                    assert changed[..., k].any(), (algorithm, slot)
                    assert not changed[..., :k].any(), (algorithm, slot)
