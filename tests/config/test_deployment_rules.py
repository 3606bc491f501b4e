"""Deployment rules: disaggregated mode, backpressure and tables the chosen mode ignores."""

from __future__ import annotations

from config_cases import BASE, position_of, replace_once

from specdraft.config.lint import lint_text
from specdraft.config.report import ExitCode

DISAGG = '\n[deployment]\nmode = "disaggregated"\n'


def _findings(text: str):
    return lint_text(text, "c.toml")


def test_disaggregated_mode_is_clean():
    assert _findings(BASE + DISAGG + "[deployment.disaggregated]\nstore = 'mooncake'\n") == []


def test_offline_features_cannot_feed_disaggregated_mode():
    text = (
        replace_once(BASE, "max_length = 2048", 'max_length = 2048\nformat = "features"') + DISAGG
    )
    [finding] = _findings(text)
    assert finding.code == "SD401"
    assert (finding.line, finding.col) == position_of(text, '"features"')


def test_high_watermark_must_hold_one_optimizer_window():
    # The window is micro_batch_size x grad_accum_steps x ranks = 2 x 4 x 2 = 16 samples.
    text = BASE + DISAGG + "nproc_per_node = 2\n[deployment.disaggregated]\nhigh_watermark = 15\n"
    [finding] = _findings(text)
    assert finding.code == "SD402"
    assert "= 16" in finding.message
    assert (finding.line, finding.col) == position_of(text, "15")
    assert _findings(text.replace("high_watermark = 15", "high_watermark = 16")) == []


def test_disaggregated_table_in_local_mode_is_ignored_with_a_warning():
    text = BASE + "\n[deployment.disaggregated]\nnum_capture_servers = 2\n"
    [finding] = _findings(text)
    assert (finding.code, finding.severity) == ("SD403", "warning")
    assert (finding.line, finding.col) == position_of(text, "[deployment.disaggregated]")
    assert ExitCode.of([finding]) == ExitCode.CLEAN
    assert ExitCode.of(lint_text(text, "c.toml", strict=True)) == ExitCode.FINDINGS


def test_mooncake_table_with_local_store_is_ignored_with_a_warning():
    text = BASE + DISAGG + "\n[deployment.disaggregated.mooncake]\nprotocol = 'tcp'\n"
    [finding] = _findings(text)
    assert finding.code == "SD403"
    assert finding.key == "deployment.disaggregated.mooncake"


def test_unknown_mode_and_bad_counts_are_schema_errors():
    text = BASE + '\n[deployment]\nmode = "cluster"\nnnodes = 0\n'
    assert [f.code for f in _findings(text)] == ["SD104", "SD105"]


def test_unknown_store_key_suggests_the_right_one():
    text = BASE + DISAGG + "[deployment.disaggregated.mooncake]\nmaster_adress = 'h:1'\n"
    [finding] = _findings(text)
    assert finding.code == "SD101"
    assert "did you mean 'master_address'?" in finding.message
    assert (finding.line, finding.col) == position_of(text, "master_adress")
