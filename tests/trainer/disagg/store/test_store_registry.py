"""A feature store is two halves found by one name: the config package's `stores/<name>.py`
(summary, settings table; the schema and the linter read it) and the trainer's
`disagg/store/<name>.py` (its StoreKind). `STORE_NAMES` is the one registration line."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest

from specdraft.config import DisaggregatedConfig
from specdraft.config.stores import STORE_NAMES, STORE_RULES, settings_tables_ignored
from specdraft.trainer.disagg.store import FeatureStore, LocalFeatureStore
from specdraft.trainer.disagg.store.base import StoreKind
from specdraft.trainer.disagg.store.factory import open_store, store_kind, store_services


def test_the_schema_the_linter_and_the_trainer_know_the_same_stores():
    schema_names = typing.get_args(DisaggregatedConfig.model_fields["store"].annotation)
    assert schema_names == STORE_NAMES == tuple(STORE_RULES)
    for name in STORE_NAMES:
        kind = store_kind(name)
        assert isinstance(kind, StoreKind) and kind.name == name
        # Each store's summary is in the field's help (docs/config.md is generated from it).
        assert STORE_RULES[name].summary in DisaggregatedConfig.model_fields["store"].description
    # A store with settings has its table mounted; the others' tables are "ignored" for it.
    for rules in STORE_RULES.values():
        if rules.settings is not None:
            assert DisaggregatedConfig.model_fields[rules.name].annotation is rules.settings
            assert rules.name in settings_tables_ignored("local")
            assert rules.name not in settings_tables_ignored(rules.name)


def test_a_store_name_without_an_implementation_says_where_it_belongs():
    with pytest.raises(ValueError, match=r"specdraft\.trainer\.disagg\.store\.redis"):
        store_kind("redis")


def test_the_local_store_opens_through_its_kind_and_needs_no_service(tmp_path: Path):
    cfg = DisaggregatedConfig()
    store = open_store(cfg, tmp_path, role="capture")
    assert isinstance(store, LocalFeatureStore) and isinstance(store, FeatureStore)
    config = type("C", (), {"deployment": type("D", (), {"disaggregated": cfg})()})()
    assert store_services(config) == []


def test_a_managed_mooncake_run_starts_its_master_first(tmp_path: Path):
    from specdraft.config import Config

    def config(manage: bool) -> Config:
        dis = DisaggregatedConfig(store="mooncake", mooncake={"manage_master": manage})
        return type("C", (), {"deployment": type("D", (), {"disaggregated": dis})()})()

    try:
        (spec,) = store_services(config(True))
    except Exception as exc:  # no mooncake_master binary here: the error names the extra
        assert "specdraft-trainer[mooncake]" in str(exc)
    else:
        assert spec.name == "mooncake_master" and spec.health is not None
    assert store_services(config(False)) == []
