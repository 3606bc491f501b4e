"""Run INSIDE build/sglang-venv (real sglang==0.5.23): the specdraft plugin through SGLang's own
plugin loader and HookRegistry, applied to SGLang's own prefill hand-off.

SGLang's scheduler modules do not import on a CPU machine (torchvision, tvm_ffi, CUDA kernels),
so the two hooked targets are installed as stand-in modules at their real dotted paths whose
hooked methods ARE SGLang's: `_append_prefill_hidden_states` and `CaptureHiddenMode` are
compiled from 0.5.23's source file, unchanged. Then `sglang.srt.plugins.load_plugins()` runs
as in a server: entry-point discovery, `register()`, `HookRegistry.apply_hooks()`.

argv[1]: "hooks" (drive the patched method: a specdraft request in chunks, a foreign one) or
"wrong-version" (the plugin told it runs on SGLang 0.5.24). argv[2]: a torch file with the rows
to hand over. stdout, last line: a JSON report.
"""

from __future__ import annotations

import ast
import io
import json
import logging
import sys
import textwrap
import types
from enum import IntEnum
from functools import total_ordering
from pathlib import Path
from types import SimpleNamespace

import sglang
import torch
from sglang_stub import StubReq

SRT = Path(sglang.__file__).parent / "srt"
PROCESSOR_MODULE = "sglang.srt.managers.scheduler_components.batch_result_processor"
LOGITS_MODULE = "sglang.srt.layers.logits_processor"


def compiled_from_source(relative: str, cls: str, member: str | None, env: dict) -> object:
    """A class, or one method of a class, of SGLang's source compiled on its own."""
    tree = ast.parse((SRT / relative).read_text())
    (node,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls]
    if member is not None:
        (node,) = [n for n in node.body if isinstance(n, ast.FunctionDef) and n.name == member]
    namespace = dict(env)
    code = "from __future__ import annotations\n" + textwrap.dedent(ast.unparse(node))
    exec(compile(code, str(SRT / relative), "exec"), namespace)
    return namespace[member or cls]


def install_stand_ins() -> type:
    """The hooked targets at their dotted paths; returns CaptureHiddenMode (SGLang's own)."""
    mode = compiled_from_source(
        "model_executor/forward_batch_info.py",
        "CaptureHiddenMode",
        None,
        {"IntEnum": IntEnum, "total_ordering": total_ordering},
    )
    append = compiled_from_source(
        "managers/scheduler_components/batch_result_processor.py",
        "SchedulerBatchResultProcessor",
        "_append_prefill_hidden_states",
        {},
    )
    processor = types.ModuleType(PROCESSOR_MODULE)
    processor.SchedulerBatchResultProcessor = type(
        "SchedulerBatchResultProcessor", (), {"_append_prefill_hidden_states": append}
    )
    logits = types.ModuleType(LOGITS_MODULE)

    class LogitsProcessor:
        def forward(self, aux, last):
            return SimpleNamespace(hidden_states=aux, last_hidden_states=last)

    logits.LogitsProcessor = LogitsProcessor
    sys.modules[PROCESSOR_MODULE] = processor
    sys.modules[LOGITS_MODULE] = logits
    return mode


def hooks_report() -> list:
    from sglang.srt.plugins.hook_registry import HookRegistry

    return [
        [target, f"{hook.__module__}.{hook.__name__}", kind.value]
        for target, hooks in HookRegistry._hooks.items()
        for kind, hook, _ in hooks
    ]


def drive(rows: torch.Tensor, mode: type, rid: str, chunks: list[int]) -> dict:
    """Hand `rows` over in chunks through the (patched) method, as the scheduler does."""
    processor_cls = sys.modules[PROCESSOR_MODULE].SchedulerBatchResultProcessor
    req = StubReq(rid, list(range(len(rows))), True)
    offset = 0
    for i, size in enumerate(chunks):
        middle = i < len(chunks) - 1
        req.inflight_middle_chunks = 1 if middle else 0
        # A batch holds other requests' rows too: this request's start at `offset`.
        batch_rows = torch.cat([torch.zeros(2, rows.shape[1]), rows[offset : offset + size]])
        end = processor_cls()._append_prefill_hidden_states(
            req=req,
            logits_output=SimpleNamespace(hidden_states=batch_rows),
            hidden_state_offset=2,
            capture_hidden_mode=mode.FULL,
            extend_input_len=size,
            store=not middle,
        )
        assert end == 2 + size, end
        offset += size
    abort = req.to_finish
    return {
        "hidden_states": req.hidden_states[:1] if req.hidden_states else [],
        "abort": None if abort is None else [abort.message, abort.status_code],
    }


def main() -> None:
    mode_name, rows_file = sys.argv[1], sys.argv[2]
    import specdraft_sglang_plugin
    from sglang.srt.plugins import load_plugins
    from sglang_stub import StubAbort
    from specdraft_sglang_plugin import feature_store

    mode = install_stand_ins()
    log = io.StringIO()
    logging.basicConfig(stream=log, level=logging.INFO)
    if mode_name == "wrong-version":
        specdraft_sglang_plugin.installed_sglang_version = lambda: "0.5.24"
    # SGLang's own FINISH_ABORT lives in schedule_batch, which does not import here.
    feature_store.finish_abort = StubAbort
    load_plugins()
    report = {"hooks": hooks_report(), "log": log.getvalue()}
    if mode_name == "hooks":
        rows = torch.load(rows_file)
        settings = feature_store._WRITER.settings
        from specdraft.trainer.disagg.wire.capture import CaptureRequest
        from specdraft.trainer.disagg.wire.sglang import capture_rid

        mine = capture_rid(CaptureRequest(settings.run_id, 3, 1, [], []), settings.secret)
        report["patched"] = hasattr(
            sys.modules[
                PROCESSOR_MODULE
            ].SchedulerBatchResultProcessor._append_prefill_hidden_states,
            "__wrapped__",
        )
        report["chunked"] = drive(rows, mode, mine, [3, 3, len(rows) - 6])
        report["foreign"] = drive(rows, mode, "someone-else-1", [len(rows)])
        report["foreign_equal"] = report["foreign"]["hidden_states"] == [rows.tolist()]
        out = sys.modules[LOGITS_MODULE].LogitsProcessor().forward(rows[:, :4], rows[:, 4:6])
        report["final_state_width"] = int(out.hidden_states.shape[1])
    print(json.dumps(report))


if __name__ == "__main__":
    main()
