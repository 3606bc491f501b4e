"""Finite, sane bounds: absurd sizes and non-finite rates are lint errors at their key (SD108
above the limit, SD105 not finite), never a traceback, an overflow or a hang later in a run
(tests/cli/test_train_bounds_cli.py: `specdraft train` refuses them before any work starts)."""

from __future__ import annotations

import math

import pytest
from config_cases import BASE, position_of, replace_once

from specdraft.config.lint import lint_text
from specdraft.config.schema import Config
from specdraft.config.schema_walk import iter_tables

# (table, key = value) inserted into the base config, and the code it must get.
CASES = [
    ("[training]", "micro_batch_size = 1e23", "SD108"),
    ("[training]", "grad_accum_steps = 1e8", "SD108"),
    ("[training]", "num_anchors = 100000000000000000000000000000", "SD108"),
    ("[training]", "learning_rate = inf", "SD105"),
    ("[training]", "learning_rate = nan", "SD105"),
    ("[training]", "learning_rate = -inf", "SD105"),
    ("[training]", "learning_rate = 2.0", "SD108"),
    ("[training]", "max_grad_norm = inf", "SD105"),
    ("[data]", "max_length = 1e12", "SD108"),
    ("[data]", "mega_batch_multiplier = 1e9", "SD108"),
    ("[model]", "block_size = 1e15", "SD108"),
    ("[model]", "num_draft_layers = 100000", "SD108"),
]


def with_line(table: str, line: str) -> str:
    """The base config with `line` added at the top of `table` (max_length replaced if set)."""
    text = BASE
    key = line.split(" = ")[0]
    if f"\n{key} = " in text:
        old = text[text.index(f"\n{key} = ") + 1 :].split("\n", 1)[0]
        return replace_once(text, old, line)
    return replace_once(text, f"{table}\n", f"{table}\n{line}\n")


@pytest.mark.parametrize(("table", "line", "code"), CASES, ids=[c[1] for c in CASES])
def test_absurd_values_are_positioned_lint_errors(table, line, code):
    text = with_line(table, line)
    findings = lint_text(text, "run.toml")
    assert [f.code for f in findings] == [code], findings
    (finding,) = findings
    value = line.split(" = ")[1]
    assert (finding.line, finding.col) == position_of(text, value, after=line.split(" = ")[0])
    assert finding.severity == "error"
    key = line.split(" = ")[0]
    assert key in finding.message
    if code == "SD108":
        assert "use a value <=" in finding.message


def test_the_largest_allowed_values_still_pass():
    text = with_line("[training]", "micro_batch_size = 4096")
    text = replace_once(text, "[training]\n", "[training]\ngrad_accum_steps = 4096\n")
    text = replace_once(text, "[training]\n", "[training]\nlearning_rate = 1.0\n")
    assert [f.code for f in lint_text(text, "run.toml") if f.severity == "error"] == []


def test_every_bound_is_finite_and_documented():
    from specdraft.config.reference import format_bound, render_reference

    reference = render_reference()
    bounded = 0
    for path, model in iter_tables():
        for name, info in model.model_fields.items():
            for meta in info.metadata:
                limit = getattr(meta, "le", None)
                if limit is None:
                    continue
                bounded += 1
                assert math.isfinite(limit)
                dotted = ".".join([*map(str, path), name])
                row = next(r for r in reference.splitlines() if r.startswith(f"| `{dotted}` |"))
                assert f"&lt;= {format_bound(limit)}" in row  # Markdown-escaped "<="
    assert bounded >= 15
    assert "| SD108 | above-limit | error |" in reference
    assert Config.model_config.get("allow_inf_nan") is False
