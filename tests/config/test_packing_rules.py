"""training.packing: the static-shapes rule (SD218, at its place) and ShapePolicy.packing."""

from __future__ import annotations

import pytest
from config_cases import BASE, position_of, replace_once
from hypothesis import given, settings
from hypothesis import strategies as st

from specdraft.config import ShapePolicy, load_config
from specdraft.config.lint import lint_text
from specdraft.config.report import ExitCode

BUCKETS = "static_shape_buckets = [512, 1024, 2048]"
DYNAMIC = replace_once(BASE, f"static_shapes = true\n{BUCKETS}", "static_shapes = false")


def _lint(text: str):
    findings = lint_text(text, "c.toml")
    return findings, ExitCode.of(findings)


def test_packing_with_static_shapes_and_buckets_is_clean():
    assert _lint(BASE + "packing = true\n") == ([], ExitCode.CLEAN)


def test_packing_with_one_static_length_is_clean():
    assert _lint(replace_once(BASE, f"\n{BUCKETS}", "") + "packing = true\n") == (
        [],
        ExitCode.CLEAN,
    )


def test_packing_requires_static_shapes_at_its_value():
    text = DYNAMIC + "packing = true\n"
    findings, status = _lint(text)
    assert [f.code for f in findings] == ["SD218"], findings
    finding = findings[0]
    assert status == ExitCode.FINDINGS and finding.severity == "error"
    assert finding.key == "training.packing"
    assert (finding.line, finding.col) == position_of(text, "true", after="packing = ")
    assert "static_shapes = true" in finding.message


def test_packing_off_changes_nothing():
    assert _lint(DYNAMIC + "packing = false\n") == ([], ExitCode.CLEAN)


def test_shape_policy_from_config_carries_packing(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text(BASE + "packing = true\nnum_anchors = 64\n")
    shapes = ShapePolicy.from_config(load_config(path))
    assert shapes.packing and shapes.row_capacity == 2048
    assert shapes.lengths == (512, 1024, 2048)
    # A micro-batch pads to the bucket of its fullest row, exactly like an unpacked one.
    assert shapes.pad_length(700) == 1024 and shapes.pad_length(2048) == 2048
    assert "packed rows of 2048" in shapes.describe()
    assert "buckets 512, 1024, 2048" in shapes.describe()
    unpacked = ShapePolicy.from_config(load_config(path, ["training.packing=false"]))
    assert not unpacked.packing and unpacked.row_capacity is None
    assert "packed" not in unpacked.describe()


def test_shape_policy_refuses_packing_without_static_shapes():
    with pytest.raises(ValueError, match="static"):
        ShapePolicy.from_parts(static_shapes=False, max_length=1024, packing=True)
    with pytest.raises(ValueError, match="static"):
        ShapePolicy(pad_to=None, packing=True)


@settings(max_examples=40, deadline=None)
@given(st.booleans(), st.booleans(), st.booleans())
def test_packing_is_accepted_exactly_with_static_shapes(packing, static, buckets):
    text = BASE if static else DYNAMIC
    if static and not buckets:
        text = replace_once(text, f"\n{BUCKETS}", "")
    findings, status = _lint(text + f"packing = {str(packing).lower()}\n")
    if packing and not static:
        assert [f.code for f in findings] == ["SD218"]
    else:
        assert status == ExitCode.CLEAN and findings == []


@pytest.mark.parametrize("name", ["length_grouped", "bucket_synchronized"])
def test_packing_warns_that_it_ignores_grouping(name):
    text = replace_once(BASE, "max_length = 2048", f"max_length = 2048\n{name} = true")
    text += "packing = true\n"
    findings, status = _lint(text)
    assert [f.code for f in findings] == ["SD219"], findings
    warning = findings[0]
    assert warning.severity == "warning" and status == ExitCode.CLEAN
    assert (warning.line, warning.col) == position_of(text, "true", after=f"{name} = ")
    assert f"data.{name} is ignored with training.packing" in warning.message
    assert _lint(text.replace("packing = true", "packing = false")) == ([], ExitCode.CLEAN)
