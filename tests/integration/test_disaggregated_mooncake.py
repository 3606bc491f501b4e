"""The managed-local disaggregated run again with store = "mooncake": the launcher starts a real
`mooncake_master`, the capture server and the producer mount memory in it, the trainer ranks
read from it. Some of Mooncake's sockets bind every interface, so the whole `specdraft train`
runs in a private network namespace with only loopback up (`unshare -n`), as docs/
disaggregated.md tells users to do on a shared machine. Same data and seed as the offline path:
the losses must match it as closely as the embedded store's run does.
"""

from __future__ import annotations

import pytest
from disagg_runs import (
    COUNTERS,
    STEPS,
    ledger_state,
    namespace_problem,
    planned_samples,
    session_data,
    shared_run,
    train,
)
from system_support import require_mooncake, require_namespace_tools

pytestmark = [pytest.mark.distributed, pytest.mark.mooncake, pytest.mark.slow]

LOSS_RTOL = 1e-4


def test_a_managed_run_on_mooncake_matches_the_offline_path(tmp_path, tmp_path_factory):
    from specdraft.trainer.disagg.producer.ledger import trained_sample_counts

    # A missing package fails with the command that installs it (make setup installs them).
    require_mooncake()
    require_namespace_tools()
    problem = namespace_problem()
    if problem:
        pytest.skip(problem)
    data = session_data(tmp_path_factory)
    run_dir = tmp_path / "run"
    online = train(run_dir, data, ("deployment.disaggregated.store=mooncake",), netns=True)
    assert online.summary["final_step"] == STEPS
    assert (run_dir / "logs" / "mooncake_master.log").is_file()
    assert "services stopped (producer, capture0, mooncake_master)" in online.stderr
    # Nothing went through the files of the embedded store.
    assert not any(p.is_file() for p in (run_dir / "feature-store").rglob("*"))

    offline = shared_run(tmp_path_factory, "offline", ("deployment.mode=local",))
    got, want = online.by_step(), offline.by_step()
    assert sorted(got) == sorted(want) == list(range(1, STEPS + 1))
    for step in want:
        assert got[step]["loss"] == pytest.approx(want[step]["loss"], rel=LOSS_RTOL), step
        assert got[step]["data/pad_lengths"] == want[step]["data/pad_lengths"], step
        assert all(name in got[step] for name in COUNTERS), step
    # The master's metrics server reports the resident bytes while windows wait in the store.
    assert max(row["store/bytes_resident"] for row in got.values()) > 0

    state = ledger_state(run_dir)
    assert trained_sample_counts(state) == {0: planned_samples(run_dir, data)}
    assert not state.live  # every object removed once its window was trained
