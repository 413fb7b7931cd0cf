"""Sweep parsing and expansion, dotted overrides, labels and the baseline choice."""

from __future__ import annotations

import pytest

from sglang_dflash.bench.sweep import (
    Sweep,
    SweepError,
    apply_override,
    apply_overrides,
    expand,
    find_baseline,
    get_dotted,
    label,
    parse_sweep,
    parse_value,
    split_top_level,
)


def test_parse_sweep_coerces_json_values_and_keeps_strings():
    assert parse_sweep("ddtree.budget=16,32,64") == Sweep("ddtree.budget", (16, 32, 64))
    assert parse_sweep("algorithm=none,dflash,ddtree").values == ("none", "dflash", "ddtree")
    assert parse_sweep("memFractionStatic=0.8, 0.9").values == (0.8, 0.9)
    assert parse_sweep("gpus=[0,1],[2,3]").values == ([0, 1], [2, 3])
    assert parse_value("true") is True and parse_value("null") is None


@pytest.mark.parametrize("bad", ["ddtree.budget", "=1,2", "ddtree..budget=1", "a=1,,2",
                                 "a=1,1", "9x=1"])
def test_parse_sweep_rejects_malformed(bad):
    with pytest.raises(SweepError):
        parse_sweep(bad)


def test_split_top_level_respects_brackets():
    assert split_top_level('[0,1],{"a":1,"b":2},x') == ["[0,1]", '{"a":1,"b":2}', "x"]


def test_expand_is_the_cartesian_product_first_sweep_outermost():
    points = expand([parse_sweep("algorithm=dflash,ddtree"),
                     parse_sweep("ddtree.budget=16,32,64")])
    assert len(points) == 6
    assert points[0] == {"algorithm": "dflash", "ddtree.budget": 16}
    assert points[1] == {"algorithm": "dflash", "ddtree.budget": 32}
    assert points[3] == {"algorithm": "ddtree", "ddtree.budget": 16}
    assert expand([]) == [{}]
    with pytest.raises(SweepError, match="twice"):
        expand([parse_sweep("a=1"), parse_sweep("a=2")])


def test_apply_override_deep_copies_and_creates_parents():
    raw = {"name": "x", "ddtree": {"budget": 64}, "gpus": [0]}
    out = apply_override(raw, "ddtree.budget", 16)
    assert out["ddtree"] == {"budget": 16} and raw["ddtree"] == {"budget": 64}
    out2 = apply_override({"name": "x"}, "ddtree.budget", 8)
    assert out2 == {"name": "x", "ddtree": {"budget": 8}}
    out3 = apply_overrides(raw, {"gpus": [0, 1], "tensorParallelSize": 2})
    out3["gpus"].append(9)
    assert raw["gpus"] == [0]
    with pytest.raises(SweepError, match="not an object"):
        apply_override(raw, "gpus.x", 1)


def test_get_dotted_and_label():
    raw = {"ddtree": {"budget": 32}, "algorithm": "ddtree"}
    assert get_dotted(raw, "ddtree.budget") == 32
    assert get_dotted(raw, "ddtree.missing", None) is None
    with pytest.raises(KeyError):
        get_dotted(raw, "nope")
    point = {"algorithm": "ddtree", "ddtree.budget": 32}
    assert label(point) == "algorithm=ddtree ddtree.budget=32"
    assert label({}) == "config"


def test_find_baseline_matches_points_or_resolved_config():
    points = [{"ddtree.budget": 16}, {"ddtree.budget": 32}]
    resolved = [{"algorithm": "ddtree", "ddtree": {"budget": b}} for b in (16, 32)]
    assert find_baseline(points, resolved, None) == 0
    assert find_baseline(points, resolved, "ddtree.budget=32") == 1
    assert find_baseline(points, resolved, "algorithm=ddtree") == 0
    with pytest.raises(SweepError, match="no configuration"):
        find_baseline(points, resolved, "algorithm=dflash")


def test_points_that_render_the_same_server_are_dropped_naming_the_ignored_keys():
    from sglang_dflash.bench.sweep import Dropped, duplicate_points

    points = expand([parse_sweep("algorithm=dflash,ddtree"), parse_sweep("ddtree.budget=8,16,32")])
    # what the server sees: the budget only reaches a DDTree server
    rendered = [(p["algorithm"], p["ddtree.budget"] if p["algorithm"] == "ddtree" else None)
                for p in points]
    assert duplicate_points(points, rendered) == [
        Dropped(1, 0, ("ddtree.budget",)), Dropped(2, 0, ("ddtree.budget",))]
    assert duplicate_points(points[3:], rendered[3:]) == []
