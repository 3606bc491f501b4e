"""The runtime's parts meet only through `wire`: the contract carries no torch, and the trainer
ranks' side reaches the producer's windows without importing the producer."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specdraft.trainer.disagg.store.tensors import DTYPES
from specdraft.trainer.disagg.wire.capture import WIRE_DTYPES


def _modules_after(statement: str) -> set[str]:
    """The modules a fresh interpreter holds after running `statement`."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return set(json.loads(done.stdout.splitlines()[-1]))


@pytest.mark.subprocess
def test_the_wire_contract_imports_no_torch():
    loaded = _modules_after("import specdraft.trainer.disagg.wire")
    assert "torch" not in loaded


def test_every_dtype_name_on_the_wire_reads_back_as_a_tensor():
    assert set(WIRE_DTYPES) == set(DTYPES)


@pytest.mark.subprocess
def test_the_trainer_ranks_side_does_not_import_the_producer():
    loaded = _modules_after("import specdraft.trainer.disagg.consumer")
    assert "specdraft.trainer.disagg.consumer.client" in loaded
    assert not [name for name in loaded if name.startswith("specdraft.trainer.disagg.producer")]
