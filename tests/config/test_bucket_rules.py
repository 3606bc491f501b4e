"""Shape-bucket and static-shape rules: each one fires, at the right place, and only then."""

from __future__ import annotations

from itertools import pairwise

import pytest
from config_cases import BASE, position_of, replace_once
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.config import ShapePolicy, effective_buckets_from, load_config
from specdraft.config.lint import lint_text
from specdraft.config.report import ExitCode

BUCKETS = "static_shape_buckets = [512, 1024, 2048]"


def _lint(text: str):
    findings = lint_text(text, "c.toml")
    return findings, ExitCode.of(findings)


def _only(findings, code):
    assert [f.code for f in findings] == [code], findings
    return findings[0]


def test_base_config_is_clean():
    assert _lint(BASE) == ([], ExitCode.CLEAN)


@pytest.mark.parametrize(
    ("buckets", "bad", "occurrence"),
    [("[512, 1000, 2048]", "1000", 0), ("[0, 2048]", "0", 0), ("[-128, 2048]", "-128", 0)],
)
def test_bucket_must_be_positive_multiple_of_128(buckets, bad, occurrence):
    text = replace_once(BASE, BUCKETS, f"static_shape_buckets = {buckets}")
    findings, status = _lint(text)
    finding = _only(findings, "SD201")
    assert status == ExitCode.FINDINGS
    assert (finding.line, finding.col) == position_of(text, bad, occurrence, after="buckets = ")
    assert finding.key == f"training.static_shape_buckets[{buckets[1:-1].split(', ').index(bad)}]"
    assert "multiple of 128" in finding.message


def test_bucket_suggests_the_next_multiple():
    text = replace_once(BASE, BUCKETS, "static_shape_buckets = [1000, 2048]")
    assert "try 1024" in _only(_lint(text)[0], "SD201").message


@pytest.mark.parametrize(("buckets", "occurrence"), [("[1024, 512, 2048]", 0), ("[512, 512]", 1)])
def test_buckets_must_strictly_increase(buckets, occurrence):
    text = replace_once(BASE, BUCKETS, f"static_shape_buckets = {buckets}")
    finding = _only(_lint(text)[0], "SD202")
    assert (finding.line, finding.col) == position_of(text, "512", occurrence, after="= [")


def test_buckets_require_static_shapes():
    text = replace_once(BASE, "static_shapes = true", "static_shapes = false")
    finding = _only(_lint(text)[0], "SD203")
    assert (finding.line, finding.col) == position_of(text, "[512, 1024, 2048]")


def test_bucket_above_max_length_is_rejected_at_the_element():
    text = replace_once(BASE, BUCKETS, "static_shape_buckets = [512, 4096]")
    finding = _only(_lint(text)[0], "SD204")
    assert (finding.line, finding.col) == position_of(text, "4096")
    assert finding.key == "training.static_shape_buckets[1]"


def test_max_length_must_be_a_multiple_of_128_with_static_shapes():
    text = replace_once(
        replace_once(BASE, "max_length = 2048", "max_length = 2000"),
        BUCKETS,
        "static_shape_buckets = [512]",
    )
    finding = _only(_lint(text)[0], "SD205")
    assert (finding.line, finding.col) == position_of(text, "2000")
    assert "try 2048" in finding.message


def test_max_length_may_be_anything_with_dynamic_shapes():
    text = replace_once(
        replace_once(BASE, "max_length = 2048", "max_length = 2000"),
        f"static_shapes = true\n{BUCKETS}",
        "static_shapes = false",
    )
    assert _lint(text) == ([], ExitCode.CLEAN)


def test_missing_max_length_is_appended_with_a_note(tmp_path):
    text = replace_once(BASE, BUCKETS, "static_shape_buckets = [512, 1024]")
    findings, status = _lint(text)
    note = _only(findings, "SD210")
    assert status == ExitCode.CLEAN
    assert note.severity == "note"
    assert "[512, 1024, 2048]" in note.message
    assert (note.line, note.col) == position_of(text, "[512, 1024]")
    path = tmp_path / "c.toml"
    path.write_text(text)
    shapes = ShapePolicy.from_config(load_config(path))
    assert shapes.lengths == (512, 1024, 2048) and shapes.lengths_appended


def test_bucket_synchronized_needs_buckets():
    text = replace_once(BASE, f"\n{BUCKETS}", "").replace(
        "max_length = 2048", "max_length = 2048\nbucket_synchronized = true"
    )
    finding = _only(_lint(text)[0], "SD206")
    assert (finding.line, finding.col) == position_of(text, "true", after="bucket_synchronized")


def test_fail_on_recompile_needs_compile_blocks():
    text = BASE + "fail_on_recompile = true\n"
    finding = _only(_lint(text)[0], "SD207")
    assert finding.key == "training.fail_on_recompile"


def test_fp8_needs_fsdp2():
    text = BASE + 'fp8_linear = true\nbackend = "fsdp1"\n'
    _only(_lint(text)[0], "SD208")


def test_fp8_with_static_shapes_only_notes_cuda():
    findings, status = _lint(BASE + "fp8_linear = true\n")
    assert _only(findings, "SD316").severity == "note"
    assert status == ExitCode.CLEAN


def test_fp8_without_static_shapes_warns_about_ragged_lengths():
    text = replace_once(BASE, f"static_shapes = true\n{BUCKETS}", "fp8_linear = true")
    findings, status = _lint(text)
    assert sorted(f.code for f in findings) == ["SD211", "SD316"]
    warning = next(f for f in findings if f.code == "SD211")
    assert warning.severity == "warning" and status == ExitCode.CLEAN
    strict = lint_text(text, "c.toml", strict=True)
    assert ExitCode.of(strict) == ExitCode.FINDINGS


def test_compile_blocks_with_dynamic_shapes_warns_about_recompiles():
    text = replace_once(BASE, f"static_shapes = true\n{BUCKETS}", "compile_blocks = true")
    finding = _only(_lint(text)[0], "SD212")
    assert finding.severity == "warning"
    assert (finding.line, finding.col) == position_of(text, "true", after="compile_blocks")


def test_compile_blocks_with_static_shapes_is_quiet():
    assert _lint(BASE + "compile_blocks = true\n") == ([], ExitCode.CLEAN)


# ------------------------------------------------------------------------- the effective tuple


def test_effective_buckets_cases():
    assert effective_buckets_from(False, 2048, [512, 1024]) is None
    assert effective_buckets_from(True, 2048, None) is None
    assert effective_buckets_from(True, 2048, []) is None
    assert effective_buckets_from(True, 2048, [512, 1024]) == (512, 1024, 2048)
    assert effective_buckets_from(True, 2048, [512, 2048]) == (512, 2048)


def test_static_lengths_without_buckets_is_max_length(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(replace_once(BASE, f"\n{BUCKETS}", ""))
    assert ShapePolicy.from_config(load_config(path)).lengths == (2048,)
    dynamic = load_config(path, ["training.static_shapes=false"])
    assert ShapePolicy.from_config(dynamic).lengths == ()


_valid_buckets = st.integers(1, 64).flatmap(
    lambda top: st.tuples(
        st.just(top * 128),
        st.lists(st.integers(1, top).map(lambda k: k * 128), unique=True).map(sorted),
    )
)


@settings(max_examples=100, deadline=None)
@given(_valid_buckets)
def test_effective_buckets_are_ascending_and_end_at_max_length(case):
    max_length, buckets = case
    out = effective_buckets_from(True, max_length, buckets)
    if not buckets:
        assert out is None
        return
    assert list(out) == sorted(set(out))
    assert out[-1] == max_length
    assert set(out) == set(buckets) | {max_length}


_any_buckets = st.lists(
    st.one_of(st.integers(-300, 9000), st.integers(0, 70).map(lambda k: k * 128)), max_size=6
)


@settings(max_examples=120, deadline=None)
@given(_any_buckets, st.integers(1, 64).map(lambda k: k * 128))
def test_random_bucket_lists_are_accepted_exactly_when_the_rules_hold(buckets, max_length):
    text = replace_once(
        replace_once(BASE, BUCKETS, f"static_shape_buckets = {buckets}"),
        "max_length = 2048",
        f"max_length = {max_length}",
    )
    findings, status = _lint(text)
    valid = (
        all(b > 0 and b % 128 == 0 for b in buckets)
        and all(a < b for a, b in pairwise(buckets))
        and all(b <= max_length for b in buckets)
    )
    if not valid:
        assert status == ExitCode.FINDINGS
        assert {f.code for f in findings} <= {"SD201", "SD202", "SD204"}
        return
    assert status == ExitCode.CLEAN
    appended = bool(buckets) and buckets[-1] != max_length
    few_positions = max_length - 1 < 512  # BASE's num_anchors: SD224
    expected = (["SD210"] if appended else []) + (["SD224"] if few_positions else [])
    assert [f.code for f in findings] == expected


# ------------------------------------------------------------------------- anchor-count buckets

ANCHORS = "num_anchors = 512\nstatic_anchor_buckets = [64, 256, 512]"


def _with_anchors(buckets: str) -> str:
    return BASE + ANCHORS.replace("[64, 256, 512]", buckets) + "\n"


def test_anchor_buckets_ending_at_num_anchors_are_clean():
    assert _lint(_with_anchors("[64, 256, 512]")) == ([], ExitCode.CLEAN)


@pytest.mark.parametrize(("buckets", "bad"), [("[0, 512]", "0"), ("[-8, 512]", "-8")])
def test_anchor_bucket_must_be_positive(buckets, bad):
    text = _with_anchors(buckets)
    finding = _only(_lint(text)[0], "SD213")
    assert (finding.line, finding.col) == position_of(text, bad, after="anchor_buckets = ")
    assert finding.key == "training.static_anchor_buckets[0]"


@pytest.mark.parametrize(("buckets", "occurrence"), [("[256, 64, 512]", 0), ("[64, 64]", 1)])
def test_anchor_buckets_must_strictly_increase(buckets, occurrence):
    text = _with_anchors(buckets)
    finding = _only(_lint(text)[0], "SD214")
    assert (finding.line, finding.col) == position_of(
        text, "64", occurrence, after="anchor_buckets = ["
    )
    assert "strictly increasing" in finding.message


def test_anchor_bucket_above_num_anchors_is_rejected_at_the_element():
    text = _with_anchors("[64, 1024]")
    finding = _only(_lint(text)[0], "SD215")
    assert (finding.line, finding.col) == position_of(text, "1024", after="anchor_buckets = ")
    assert finding.key == "training.static_anchor_buckets[1]"
    assert "num_anchors = 512" in finding.message and "raise num_anchors" in finding.message


def test_anchor_buckets_require_static_shapes():
    text = replace_once(_with_anchors("[64, 512]"), f"static_shapes = true\n{BUCKETS}", "")
    finding = _only(_lint(text)[0], "SD216")
    assert (finding.line, finding.col) == position_of(text, "[64, 512]")
    assert "static_shapes = true" in finding.message


def test_missing_num_anchors_is_appended_with_a_note(tmp_path):
    text = _with_anchors("[64, 256]")
    findings, status = _lint(text)
    note = _only(findings, "SD217")
    assert status == ExitCode.CLEAN and note.severity == "note"
    assert "[64, 256, 512]" in note.message
    assert (note.line, note.col) == position_of(text, "[64, 256]")
    path = tmp_path / "c.toml"
    path.write_text(text)
    shapes = ShapePolicy.from_config(load_config(path))
    assert shapes.anchor_widths == (64, 256, 512) and shapes.anchors_appended


@settings(max_examples=120, deadline=None)
@given(
    st.lists(st.integers(-5, 600), max_size=5),
    st.integers(1, 512),
    st.booleans(),
)
def test_random_anchor_buckets_are_accepted_exactly_when_the_rules_hold(buckets, num, static):
    text = BASE + f"num_anchors = {num}\nstatic_anchor_buckets = {buckets}\n"
    if not static:
        text = replace_once(text, f"static_shapes = true\n{BUCKETS}", "")
    findings, status = _lint(text)
    valid = (
        all(b > 0 for b in buckets)
        and all(a < b for a, b in pairwise(buckets))
        and all(b <= num for b in buckets)
        and (static or not buckets)
    )
    if not valid:
        assert status == ExitCode.FINDINGS
        assert {f.code for f in findings} <= {"SD213", "SD214", "SD215", "SD216"}
        return
    assert status == ExitCode.CLEAN
    appended = bool(buckets) and buckets[-1] != num
    assert [f.code for f in findings] == (["SD217"] if appended else [])


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(1, 64), unique=True, max_size=4).map(sorted),
    st.integers(0, 100),
    st.booleans(),
)
def test_the_anchor_width_is_the_smallest_that_holds_the_count(buckets, count, static):
    num_anchors = 64
    shapes = ShapePolicy.from_parts(
        static_shapes=static,
        max_length=1024,
        num_anchors=num_anchors,
        anchor_buckets=buckets if static else None,
    )
    width = shapes.anchor_width(count)
    need = min(count, num_anchors)
    if not static:
        # Pad-to-longest: exactly the batch's largest count (one masked block for none).
        assert width == max(1, need)
        assert shapes.grid == ()
        return
    assert width in shapes.anchor_widths and width >= need
    assert all(w < need for w in shapes.anchor_widths if w < width)
    assert shapes.anchor_widths[-1] == num_anchors
    if not buckets:
        assert width == num_anchors  # static without anchor buckets keeps num_anchors
    assert len(shapes.grid) == len(shapes.lengths) * len(shapes.anchor_widths)
