"""The config package's family registry: the schema is built from it, and it stays torch-free."""

from __future__ import annotations

import subprocess
import sys
from typing import get_args

import pytest
from pydantic import ValidationError

from specdraft.config import ModelConfig, validate_config
from specdraft.config.codes import code_for
from specdraft.config.families import FAMILY_NAMES, FAMILY_RULES, FamilyRules
from specdraft.config.registry import load_registered
from specdraft.config.schema import RULE_TYPES


def test_loading_the_families_and_the_schema_imports_neither_torch_nor_the_trainer():
    code = (
        "import sys, specdraft.config.families, specdraft.config.schema, specdraft.config.lint\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'"
        " or m.startswith('specdraft.trainer')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]"


def test_the_schema_admits_exactly_the_registered_families_and_mounts_their_tables():
    assert list(FAMILY_RULES) == list(FAMILY_NAMES)
    assert get_args(ModelConfig.model_fields["algorithm"].annotation) == FAMILY_NAMES
    described = ModelConfig.model_fields["algorithm"].description or ""
    for rules in FAMILY_RULES.values():
        assert f"'{rules.name}' ({rules.summary})" in described
        if rules.options is None:
            assert rules.name not in ModelConfig.model_fields
            continue
        field = ModelConfig.model_fields[rules.name]
        assert field.annotation is rules.options
        assert f"algorithm = '{rules.name}'" in (field.description or "")
    # Fields of the shared part come first, the family tables last, in registry order.
    tables = [name for name in ModelConfig.model_fields if name in FAMILY_RULES]
    assert tables == [r.name for r in FAMILY_RULES.values() if r.options is not None]


def test_every_family_rule_is_a_schema_rule_with_its_own_model_code():
    for rules in FAMILY_RULES.values():
        for rule_type in rules.rule_types:
            assert rule_type in RULE_TYPES
            assert code_for(rule_type).code.startswith("SD3")


def test_the_chosen_familys_rules_run_and_the_others_do_not():
    base = {
        "model": {"target": "/t", "target_layer_ids": [1], "mask_token_id": 3},
        "data": {"train_paths": ["x.jsonl"]},
    }
    # DFlash2's gold-policy rule applies only when DFlash2 is chosen.
    validate_config({**base, "model": {**base["model"], "algorithm": "dspark"}})
    with pytest.raises(ValidationError) as error:
        validate_config({**base, "model": {**base["model"], "algorithm": "dflash2"}})
    [problem] = error.value.errors()
    assert problem["type"] == "selector_gold_policy_missing"
    assert problem["ctx"]["key"] == "model.dflash2.selector_gold_policy"


def test_a_registry_name_whose_module_has_no_rules_of_that_name_is_refused():
    with pytest.raises(TypeError, match=r"families\.base\.RULES must be the FamilyRules named"):
        load_registered("specdraft.config.families", ["base"], FamilyRules)


def test_a_familys_lint_codes_live_with_the_family_and_join_the_code_table():
    import inspect

    from specdraft.config import codes

    declared = [code for rules in FAMILY_RULES.values() for code in rules.codes]
    assert {c.code for c in FAMILY_RULES["dflash2"].codes} == {"SD303", "SD317", "SD325"}
    for code in declared:
        assert codes.get(code.code) is code
        assert code in codes.CODES
    # One table in code order, each number once; the shared module names no family's code.
    assert [c.code for c in codes.CODES] == sorted(c.code for c in codes.CODES)
    assert len(codes.BY_CODE) == len(codes.CODES)
    source = inspect.getsource(codes)
    for code in declared:
        assert code.code not in source
    # A family's rule types are reported under the family's own codes.
    for rules in FAMILY_RULES.values():
        for rule_type in rules.rule_types:
            assert code_for(rule_type) in rules.codes


def test_the_families_served_with_a_draft_vocabulary_come_from_the_registry():
    from specdraft.config.draft_vocab_rules import served_with_draft_vocab

    assert served_with_draft_vocab() == tuple(
        name for name, rules in FAMILY_RULES.items() if rules.draft_vocab_served
    )
    assert served_with_draft_vocab() == ("dflash", "dspark")


def test_importing_the_families_first_or_the_codes_first_both_work():
    # The table imports the families; they declare codes with lint_code.Code, not the table.
    for first in ("specdraft.config.families", "specdraft.config.codes"):
        code = f"import {first}\nfrom specdraft.config.codes import CODES\nprint(len(CODES))"
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        assert int(done.stdout) > 50
