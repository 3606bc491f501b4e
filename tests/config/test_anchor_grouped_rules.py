"""data.anchor_grouped: where it is refused (SD220), pointless (SD221), overrides length grouping
(SD222) or is ignored (SD219, packing), each at the value that causes it."""

from __future__ import annotations

from config_cases import BASE, position_of, replace_once
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.config.lint import lint_text
from specdraft.config.report import ExitCode

BUCKETS = "static_shape_buckets = [512, 1024, 2048]"
ANCHORS = "static_anchor_buckets = [128, 256, 512]\n"


def _lint(text: str):
    findings = lint_text(text, "c.toml")
    return findings, ExitCode.of(findings)


def _data(text: str, line: str) -> str:
    return replace_once(text, "max_length = 2048", f"max_length = 2048\n{line}")


def test_anchor_grouped_with_anchor_buckets_is_clean():
    assert _lint(_data(BASE + ANCHORS, "anchor_grouped = true")) == ([], ExitCode.CLEAN)


def test_anchor_grouped_with_pad_to_longest_is_clean():
    # Pad-to-longest computes the batch's largest anchor count: grouping narrows it.
    dynamic = replace_once(BASE, f"static_shapes = true\n{BUCKETS}", "static_shapes = false")
    assert _lint(_data(dynamic, "anchor_grouped = true")) == ([], ExitCode.CLEAN)


def test_anchor_grouped_with_bucket_sync_is_an_error_at_its_value():
    text = _data(BASE + ANCHORS, "anchor_grouped = true\nbucket_synchronized = true")
    findings, status = _lint(text)
    assert [f.code for f in findings] == ["SD220"], findings
    error = findings[0]
    assert status == ExitCode.FINDINGS and error.severity == "error"
    assert error.key == "data.anchor_grouped"
    assert (error.line, error.col) == position_of(text, "true", after="anchor_grouped = ")
    assert "drop one of them" in error.message


def test_anchor_grouped_without_anchor_buckets_warns_that_it_does_nothing():
    text = _data(BASE, "anchor_grouped = true")
    findings, status = _lint(text)
    assert [f.code for f in findings] == ["SD221"], findings
    warning = findings[0]
    assert warning.severity == "warning" and status == ExitCode.CLEAN
    assert (warning.line, warning.col) == position_of(text, "true", after="anchor_grouped = ")
    assert "static_anchor_buckets" in warning.message and "explain-buckets" in warning.message


def test_length_grouping_is_ignored_under_anchor_grouping_at_its_value():
    text = _data(BASE + ANCHORS, "anchor_grouped = true\nlength_grouped = true")
    findings, _ = _lint(text)
    assert [f.code for f in findings] == ["SD222"], findings
    assert (findings[0].line, findings[0].col) == position_of(
        text, "true", after="length_grouped = "
    )


def test_packing_ignores_anchor_grouping():
    text = _data(BASE + ANCHORS + "packing = true\n", "anchor_grouped = true")
    findings, status = _lint(text)
    assert [f.code for f in findings] == ["SD219"], findings
    assert "data.anchor_grouped is ignored with training.packing" in findings[0].message
    assert status == ExitCode.CLEAN


@settings(max_examples=60, deadline=None)
@given(
    grouped=st.booleans(),
    length=st.booleans(),
    sync=st.booleans(),
    anchors=st.booleans(),
    packing=st.booleans(),
)
def test_the_rules_fire_exactly_when_their_cause_is_there(grouped, length, sync, anchors, packing):
    lines = [f"anchor_grouped = {str(grouped).lower()}"]
    lines += ["length_grouped = true"] if length else []
    lines += ["bucket_synchronized = true"] if sync else []
    text = _data(BASE + (ANCHORS if anchors else "") + ("packing = true\n" if packing else ""),
                 "\n".join(lines))  # fmt: skip
    codes = sorted(f.code for f in _lint(text)[0])
    expected = []
    if packing:
        expected += ["SD219"] * (grouped + length + sync)
    elif grouped and sync:
        expected = ["SD220"]  # an error stops the soft rules
    elif grouped:
        expected += [] if anchors else ["SD221"]
        expected += ["SD222"] if length else []
    assert codes == sorted(expected)
