"""The config file's [scheduler] table: workers and tier weights reach the scheduler."""

from __future__ import annotations

import pytest

from asynctier.platform.config import Settings
from asynctier.platform.errors import ConfigError
from asynctier.scheduler.options import options_from_settings
from asynctier.scheduler.queues import FairQueue


def test_tier_weights_and_workers_come_from_the_file() -> None:
    settings = Settings.from_mapping({"scheduler": {"workers": 3,
                                                    "tier_weights": {"batch": 4}}})
    options = options_from_settings(settings)
    assert options.workers == 3
    assert dict(options.tier_weights) == {"urgent": 8.0, "normal": 4.0, "batch": 4.0}


def test_file_weights_change_the_shares() -> None:
    options = options_from_settings(Settings.from_mapping(
        {"scheduler": {"tier_weights": {"urgent": 1, "batch": 1}}}))
    fair: FairQueue[str] = FairQueue(1, options.tier_weights)
    for _ in range(40):
        fair.push("urgent", "t", "u", 1)
        fair.push("batch", "t", "b", 1)
    got = [fair.pop() for _ in range(40)]
    assert got.count("u") == got.count("b") == 20  # 1:1, not the default 8:1


def test_cpu_bound_item_ms_sets_the_move_and_0_turns_it_off() -> None:
    assert options_from_settings(Settings.from_mapping({})).cpu_bound_item_s == 0.0001
    assert options_from_settings(Settings.from_mapping(
        {"scheduler": {"cpu_bound_item_ms": 2}})).cpu_bound_item_s == 0.002
    assert options_from_settings(Settings.from_mapping(
        {"scheduler": {"cpu_bound_item_ms": 0}})).cpu_bound_item_s is None


def test_without_the_table_the_defaults_hold() -> None:
    options = options_from_settings(Settings.from_mapping({}))
    assert options.workers == 8 and options.tier_weights["urgent"] == 8.0


@pytest.mark.parametrize("table, says", [
    ({"tier_weights": {"critical": 2}}, "tier_weights must be a table of"),
    ({"tier_weights": {"urgent": 0}}, "tier_weights.urgent = 0"),
    ({"workers": 0}, "workers = 0"),
    ({"weights": {}}, "unknown key(s) ['weights'] in [scheduler]"),
    ({"cpu_bound_item_ms": "fast"}, "cpu_bound_item_ms = 'fast'"),
    ({"cpu_bound_item_ms": -1}, "cpu_bound_item_ms = -1"),
])
def test_a_bad_table_says_what_to_fix(table: dict[str, object], says: str) -> None:
    with pytest.raises(ConfigError) as err:
        Settings.from_mapping({"scheduler": table})
    assert says in str(err.value)


def test_stop_grace_comes_from_the_file() -> None:
    options = options_from_settings(Settings.from_mapping({"scheduler": {"stop_grace": "5m"}}))
    assert options.stop_grace_s == 300.0
    assert options_from_settings(Settings.from_mapping({})).stop_grace_s == 30.0
    with pytest.raises(ConfigError, match="stop_grace = '3h': give 1s to 2h"):
        Settings.from_mapping({"scheduler": {"stop_grace": "3h"}})
