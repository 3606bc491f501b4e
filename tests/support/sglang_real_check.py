"""Run INSIDE build/sglang-venv (real sglang==0.5.23): SGLang's own verdict on launch argvs.

stdin: a JSON list of argv lists (what follows `python -m sglang.launch_server`); stdout, last
line: a JSON list of {"ok": bool, "error": str} in the same order. An argv passes when
`prepare_server_args` parses it and `handle_aux_hidden_state_capture` accepts it.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

from sglang.srt.arg_groups.validation_hook import handle_aux_hidden_state_capture
from sglang.srt.server_args import prepare_server_args


def verdict(argv: list[str]) -> dict[str, object]:
    """SGLang's verdict on one argv."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = prepare_server_args(argv)
        handle_aux_hidden_state_capture(args)
    except SystemExit:  # argparse: an unknown or malformed flag
        return {"ok": False, "error": stderr.getvalue().strip().splitlines()[-1]}
    except ValueError as exc:
        return {"ok": False, "error": str(exc)}
    return {"ok": True, "error": ""}


if __name__ == "__main__":
    print(json.dumps([verdict(list(argv)) for argv in json.load(sys.stdin)]))
