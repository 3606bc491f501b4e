"""The plugin's feature-store hook driven with objects shaped as SGLang 0.5.23 passes them (the
request's id, `return_hidden_states`, the batch's hidden-state tensor and the request's offset
in it, chunk by chunk): it writes exactly the bytes the embedded capture server writes for the
same hidden states, however the prompt is chunked, leaves every other request to stock SGLang,
and fails only the one request whose write fails, leaving nothing in the store."""

from __future__ import annotations

import stat
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sglang_stub import (
    StubAbort,
    StubReq,
    hand_over_chunk,
    stock_append_prefill_hidden_states,
)
from sglang_venv import PLUGIN_SRC

from specdraft.trainer.disagg.store.base import StoreError
from specdraft.trainer.disagg.store.local import LocalFeatureStore
from specdraft.trainer.disagg.store.tensors import tensors_to_store
from specdraft.trainer.disagg.wire import CaptureRequest, capture_spec
from specdraft.trainer.disagg.wire.sglang import (
    PLUGIN_CONFIG_ENV,
    PluginSettings,
    capture_rid,
    probe_rid,
    read_plugin_settings,
    write_plugin_settings,
)

assert PLUGIN_SRC.is_dir()
import specdraft_sglang_plugin  # noqa: E402
from specdraft_sglang_plugin import feature_store  # noqa: E402

SECRET = "5e" * 32
RUN = "run1"


@pytest.fixture(autouse=True)
def _stub_abort(monkeypatch):
    # SGLang's FINISH_ABORT needs its scheduler modules; the stand-in has the same two fields.
    monkeypatch.setattr(feature_store, "finish_abort", StubAbort)
    yield
    feature_store.disable()


def _enable(folder: Path, *, layer_ids=(0, 2), hidden=4, dspark=False, store="local") -> Path:
    settings = PluginSettings(
        run_id=RUN,
        secret=SECRET,
        layer_ids=tuple(layer_ids),
        hidden_size=hidden,
        with_last_hidden=dspark,
        dtype="bfloat16",
        store=store,
        run_dir=str(folder),
    )
    path = write_plugin_settings(folder / "capture.json", settings)
    feature_store.enable(str(path))
    return path


def _rid(sample: int = 3, attempt: int = 0) -> str:
    return capture_rid(CaptureRequest(RUN, sample, attempt, [], []), SECRET)


def hand_over(req: StubReq, rows: torch.Tensor, chunks: list[int], *, pad: int = 2) -> list:
    """The scheduler's calls for one request, chunk by chunk; each batch holds `pad` rows of
    other requests before this one's. Returns what the stock method was called with."""
    calls = []

    def stock(processor, **kwargs):
        calls.append(kwargs)
        return stock_append_prefill_hidden_states(processor, **kwargs)

    def hooked(processor, **kwargs):
        return feature_store.capture_prefill_rows(stock, processor, **kwargs)

    start = 0
    for i, size in enumerate(chunks):
        middle = i < len(chunks) - 1
        req.inflight_middle_chunks = 1 if middle else 0
        batch = torch.cat([torch.full((pad, rows.shape[1]), 7.0), rows[start : start + size]])
        end = hand_over_chunk(hooked, req, batch, offset=pad, size=size, store=not middle)
        assert end == pad + size  # the next request's offset, as SGLang's own method returns
        start += size
    return calls


def _embedded_bytes(folder: Path, request: CaptureRequest, spec, hidden, last) -> dict:
    """What the embedded capture server stores for these features (its writer, all tensors)."""
    store = LocalFeatureStore(folder)
    tensors = {
        "input_ids": torch.tensor(request.input_ids),
        "loss_mask": torch.tensor(request.loss_mask),
        "hidden_states": hidden.to(torch.bfloat16),
        "target_last_hidden_states": last.to(torch.bfloat16),
    }
    reply = tensors_to_store(store, request, spec, tensors)
    return {m.key: (m, bytes(store.get(m.key))) for m in reply.tensors}


@settings(max_examples=20, deadline=None)
@given(
    seq_len=st.integers(1, 12),
    cuts=st.lists(st.integers(1, 11), max_size=4),
    order=st.permutations([0, 2, 3]),
    dspark=st.booleans(),
)
def test_any_chunking_writes_the_bytes_the_embedded_server_writes(seq_len, cuts, order, dspark):
    layers, width = tuple(order), 4
    bounds = sorted({c for c in cuts if c < seq_len})
    chunks = [b - a for a, b in zip([0, *bounds], [*bounds, seq_len], strict=True)]
    torch.manual_seed(seq_len)
    by_layer = {k: torch.randn(seq_len, width) for k in layers}
    last = torch.randn(seq_len, width)
    # SGLang's rows: the tapped layers ascending, then (the plugin's other hook) the final state.
    rows = torch.cat([by_layer[k] for k in sorted(layers)] + [last], dim=-1).to(torch.bfloat16)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        _enable(folder, layer_ids=layers, hidden=width, dspark=dspark)
        req = StubReq(_rid(5, 2), list(range(100, 100 + seq_len)), True)
        calls = hand_over(req, rows, chunks)
        assert calls == []  # SGLang's own method never ran: no tolist, no list of lists
        (ref,) = req.hidden_states
        assert req.to_finish is None and ref["specdraft_features"] == 1
        request = CaptureRequest(RUN, 5, 2, req.origin_input_ids, [1] * seq_len)
        spec = capture_spec(layers, width, algorithm="dspark" if dspark else "dflash2")
        hidden = torch.cat([by_layer[k] for k in layers], dim=-1)
        expected = _embedded_bytes(folder / "embedded", request, spec, hidden, last)
        store = LocalFeatureStore(folder / "feature-store")
        names = ["hidden_states"] + (["target_last_hidden_states"] if dspark else [])
        assert [t["name"] for t in ref["tensors"]] == names
        for meta in ref["tensors"]:
            want, data = expected[meta["key"]]
            assert (meta["shape"], meta["dtype"]) == (list(want.shape), want.dtype)
            assert bytes(store.get(meta["key"])) == data
        assert getattr(req, feature_store.ROWS_ATTR) is None  # nothing kept after the write


@pytest.mark.parametrize(
    "why",
    ["untagged", "wrong secret", "other run", "last only", "no hidden states", "not enabled"],
)
def test_requests_that_are_not_specdrafts_are_left_exactly_to_stock_sglang(tmp_path, why):
    _enable(tmp_path)
    rows = torch.randn(5, 8).to(torch.bfloat16)
    rid, mode = _rid(), True
    if why == "untagged":
        rid = f"{RUN}/3/g0"
    elif why == "wrong secret":
        rid = capture_rid(CaptureRequest(RUN, 3, 0, [], []), "ff" * 32)
    elif why == "other run":
        rid = capture_rid(CaptureRequest("other", 3, 0, [], []), SECRET)
    elif why == "last only":
        mode = "last"
    elif why == "no hidden states":
        mode = False
    elif why == "not enabled":
        feature_store.disable()

    def run() -> tuple[StubReq, list]:
        req = StubReq(rid, list(range(5)), True)
        req.return_hidden_states = mode
        calls = hand_over(req, rows, [2, 3])
        # The same arguments (this request's own object aside).
        seen = [{**c, "logits_output": c["logits_output"].hidden_states.tolist()} for c in calls]
        assert all(c.pop("req") is req for c in seen)
        return req, seen

    req, calls = run()
    feature_store.disable()
    stock_req, stock_calls = run()
    # Every call reached SGLang's own method unchanged, and the request ends as without us.
    assert calls == stock_calls and len(calls) == 2
    assert req.hidden_states == stock_req.hidden_states and req.to_finish is None
    if mode is True:
        assert req.hidden_states == [rows[2:].tolist()]  # stock 0.5.23: the last chunk only
    assert LocalFeatureStore(tmp_path / "feature-store").bytes_resident() == 0


def _one_call(req: StubReq, rows: torch.Tensor, *, store: bool) -> None:
    def hooked(processor, **kwargs):
        return feature_store.capture_prefill_rows(
            stock_append_prefill_hidden_states, processor, **kwargs
        )

    hand_over_chunk(hooked, req, rows, offset=0, size=len(rows), store=store)


class FailingStore(LocalFeatureStore):
    """A local store whose writes of one tensor name fail (a full Mooncake segment, a disk)."""

    def __init__(self, root: Path, fail_name: str) -> None:
        super().__init__(root)
        self.fail_name = fail_name

    def put(self, key, data):
        if key.endswith(self.fail_name):
            raise StoreError(f"cannot put {key!r}: no room")
        super().put(key, data)


def test_a_failed_write_fails_that_request_only_and_leaves_nothing_resident(tmp_path):
    _enable(tmp_path, dspark=True)
    store = FailingStore(tmp_path / "feature-store", "target_last_hidden_states")
    feature_store._WRITER._store = store
    rows = torch.randn(6, 12).to(torch.bfloat16)
    bad = StubReq(_rid(3, 0), list(range(6)), True)
    hand_over(bad, rows, [4, 2])
    # The hidden states were written first, then removed again: nothing of the attempt stays.
    assert isinstance(bad.to_finish, StubAbort) and bad.to_finish.status_code == 503
    assert "sample 3 attempt 0" in bad.to_finish.message and "no room" in bad.to_finish.message
    assert bad.hidden_states == [] and store.bytes_resident() == 0
    # The scheduler keeps serving: the next request (the producer's retry) is written.
    store.fail_name = "nothing"
    retry = StubReq(_rid(3, 1), list(range(6)), True)
    hand_over(retry, rows, [6])
    assert retry.to_finish is None and retry.hidden_states[0]["attempt"] == 1
    assert store.bytes_resident() == 6 * (8 + 4) * 2


def test_a_discarded_or_retracted_request_drops_its_rows_and_a_restart_is_clean(tmp_path):
    _enable(tmp_path)
    rows = torch.randn(6, 8).to(torch.bfloat16)
    store = LocalFeatureStore(tmp_path / "feature-store")
    # A middle chunk, then the request is aborted: its last chunk comes with store=False.
    aborted = StubReq(_rid(1), list(range(6)), True)
    aborted.inflight_middle_chunks = 1
    _one_call(aborted, rows[:3], store=False)
    assert getattr(aborted, feature_store.ROWS_ATTR).filled == 3
    aborted.inflight_middle_chunks = 0
    _one_call(aborted, rows[3:], store=False)
    assert getattr(aborted, feature_store.ROWS_ATTR) is None and aborted.hidden_states == []
    # Retracted after a chunk: the rows go; SGLang prefills it again from its first token.
    req = StubReq(_rid(2), list(range(6)), True)
    req.inflight_middle_chunks = 1
    _one_call(req, torch.randn(3, 8), store=False)
    req.is_retracted = True
    _one_call(req, torch.randn(3, 8), store=False)
    assert getattr(req, feature_store.ROWS_ATTR) is None
    req.is_retracted = False
    hand_over(req, rows, [3, 3])
    (ref,) = req.hidden_states
    (meta,) = ref["tensors"]
    assert bytes(store.get(meta["key"])) == rows.contiguous().view(torch.uint8).numpy().tobytes()
    assert store.bytes_resident() == rows.numel() * 2


def test_too_few_rows_abort_naming_the_radix_cache_flag(tmp_path):
    _enable(tmp_path)
    req = StubReq(_rid(), list(range(6)), True)
    hand_over(req, torch.randn(4, 8), [4])
    assert "--disable-radix-cache" in req.to_finish.message and req.hidden_states == []
    assert LocalFeatureStore(tmp_path / "feature-store").bytes_resident() == 0


def test_the_probe_is_answered_with_the_settings_and_writes_nothing(tmp_path):
    _enable(tmp_path, layer_ids=(2, 0), dspark=True)
    req = StubReq(probe_rid(RUN, SECRET), [1, 2, 3], True)
    hand_over(req, torch.randn(3, 12), [2, 1])
    (ref,) = req.hidden_states
    assert ref["probe"] is True and ref["layer_ids"] == [2, 0] and ref["row_width"] == 12
    assert LocalFeatureStore(tmp_path / "feature-store").bytes_resident() == 0


def test_other_tensor_parallel_ranks_write_and_send_nothing(tmp_path, monkeypatch):
    _enable(tmp_path)
    monkeypatch.setattr(feature_store, "is_writer_rank", lambda: False)
    req = StubReq(_rid(), list(range(4)), True)
    calls = hand_over(req, torch.randn(4, 8), [4])
    assert calls == [] and req.hidden_states == [] and req.to_finish is None


def test_the_settings_file_is_private_and_names_a_bad_field(tmp_path):
    path = _enable(tmp_path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_plugin_settings(path).secret == SECRET
    path.chmod(0o644)
    with pytest.raises(ValueError, match="chmod 600"):
        read_plugin_settings(path)
    path.chmod(0o600)
    path.write_text('{"run_id": "r"}')
    with pytest.raises(ValueError, match="field 'secret'"):
        read_plugin_settings(path)
    assert specdraft_sglang_plugin.CONFIG_ENV == PLUGIN_CONFIG_ENV


def test_another_sglang_version_is_refused_naming_both():
    import tomllib

    with pytest.raises(specdraft_sglang_plugin.WrongSGLangVersion) as err:
        specdraft_sglang_plugin.check_sglang_version("0.5.24")
    assert "built for SGLang 0.5.23" in str(err.value) and "SGLang 0.5.24" in str(err.value)
    specdraft_sglang_plugin.check_sglang_version("0.5.23")
    project = tomllib.loads((PLUGIN_SRC.parent / "pyproject.toml").read_text())["project"]
    assert project["version"] == specdraft_sglang_plugin.__version__
