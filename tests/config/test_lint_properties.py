"""Property tests: whatever the document, the linter answers with well-formed findings."""

from __future__ import annotations

import json
import re

import tomli
from config_cases import BASE
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdraft.config.codes import BY_CODE
from specdraft.config.lint import lint_text
from specdraft.config.loader import validate_config
from specdraft.config.report import TEXT_LINE, ExitCode, render_json, render_text
from specdraft.config.schema_walk import iter_tables
from specdraft.config.toml_writer import dump_toml

FIELDS = ["model", "data", "training", "deployment", "tracking"] + [
    name for _, model in iter_tables() for name in model.model_fields
]
JSON_FIELDS = {"path", "line", "col", "code", "severity", "message", "key"}


def assert_well_formed(text: str, findings) -> None:
    """Every finding is placed inside the document, has a known code, and renders cleanly."""
    lines = max(1, text.count("\n") + 1)
    for f in findings:
        assert f.code in BY_CODE and f.code != "SD003", f.message  # SD003 = the linter crashed
        assert f.severity in ("error", "warning", "note")
        assert 1 <= f.line <= lines and f.col >= 1
    assert ExitCode.of(findings) in (0, 1, 2)
    rendered = render_text(findings)
    for line in rendered.splitlines():
        assert re.match(TEXT_LINE, line), line
    assert len(rendered.splitlines()) == len(findings)
    objects = json.loads(render_json(findings))
    assert all(set(o) == JSON_FIELDS for o in objects)


_scalar = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True),
    st.booleans(),
    st.text(max_size=20),
)
_value = st.recursive(
    st.one_of(_scalar, st.lists(_scalar, max_size=4)),
    lambda inner: st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)
_documents = st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), _value, max_size=6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_documents)
def test_random_toml_documents_never_crash_the_linter(document):
    text = dump_toml(document)
    findings = lint_text(text, "random.toml")
    assert_well_formed(text, findings)
    if ExitCode.of(findings) == ExitCode.CLEAN:
        validate_config(tomli.loads(text))  # clean for the linter means loadable


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_mutated_configs_never_crash_the_linter(data):
    text = BASE
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(text)))
        cut = data.draw(st.integers(0, 12))
        insert = data.draw(st.text(alphabet=st.sampled_from(list('[]{}"\'=.,#\n \t-0129azé\x00')),
                                   max_size=6))  # fmt: skip
        text = text[:at] + insert + text[at + cut :]
    assert_well_formed(text, lint_text(text, "mutated.toml"))


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_never_crashes_the_linter(text):
    assert_well_formed(text, lint_text(text, "text.toml"))
