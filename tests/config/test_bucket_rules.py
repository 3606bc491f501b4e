"""Shape-bucket and static-shape rules: each one fires, at the right place, and only then."""

from __future__ import annotations

from itertools import pairwise

import pytest
from config_cases import BASE, position_of, replace_once
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.config import effective_buckets_from, load_config, static_lengths
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


def test_missing_max_length_is_appended_with_a_note():
    text = replace_once(BASE, BUCKETS, "static_shape_buckets = [512, 1024]")
    findings, status = _lint(text)
    note = _only(findings, "SD210")
    assert status == ExitCode.CLEAN
    assert note.severity == "note"
    assert "[512, 1024, 2048]" in note.message
    assert (note.line, note.col) == position_of(text, "[512, 1024]")


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
    assert static_lengths(load_config(path)) == (2048,)
    assert static_lengths(load_config(path, ["training.static_shapes=false"])) is None


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
    assert [f.code for f in findings] == (["SD210"] if appended else [])
