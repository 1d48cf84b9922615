"""Lanes split a channel's limits statically: configured shares, else evenly among the lanes serving it."""

from __future__ import annotations

import pytest

from notifications_retry.conf import (
    DEFAULT_LANE,
    covers,
    lane_channels,
    share,
    share_problems,
    shared_limits,
)

LANES = {
    "urgent": {"priorities": [0], "channels": ["orders", "bulk-mail"]},
    "bulk": {"channels": ["bulk-mail"]},
    "all": {"priorities": [5]},  # no channel list: every channel
}


def test_which_channels_a_lane_serves():
    assert lane_channels(LANES, "bulk") == frozenset({"bulk-mail"})
    assert lane_channels(LANES, "all") is None
    assert lane_channels(LANES, DEFAULT_LANE) is None
    assert covers(LANES, "all", "anything") and not covers(LANES, "bulk", "orders")


def test_even_split_among_the_configured_lanes_that_serve_the_channel():
    assert share(LANES, "urgent", "orders") == pytest.approx(1 / 2)  # urgent and all
    assert share(LANES, "bulk", "bulk-mail") == pytest.approx(1 / 3)  # urgent, bulk and all
    assert share(LANES, "all", "sms") == 1.0  # nobody else serves sms


def test_the_default_lane_takes_the_whole_limit_unless_it_is_configured():
    assert share(LANES, DEFAULT_LANE, "bulk-mail") == 1.0
    with_default = {**LANES, DEFAULT_LANE: {}}
    assert share(with_default, DEFAULT_LANE, "bulk-mail") == pytest.approx(1 / 4)


def test_an_explicit_share_wins():
    lanes = {"urgent": {"channels": ["mail"], "shares": {"mail": 0.8}}, "bulk": {"channels": ["mail"]}}
    assert share(lanes, "urgent", "mail") == 0.8
    assert share(lanes, "bulk", "mail") == 0.5  # the even split of the lanes without a share


def test_shared_limits_keep_at_least_one_call_and_scale_the_rate():
    assert shared_limits(LANES, "bulk", "bulk-mail", max_concurrency=10, rate_limit=30.0) == (3, 10.0)
    assert shared_limits(LANES, "bulk", "bulk-mail", max_concurrency=1, rate_limit=None) == (1, None)


@pytest.mark.parametrize(
    ("lanes", "fragment"),
    [
        ({"a": {"channels": ["m"], "shares": {"m": 0}}}, "fraction in (0, 1]"),
        ({"a": {"channels": ["m"], "shares": {"m": 1.5}}}, "fraction in (0, 1]"),
        ({"a": {"channels": ["m"], "shares": {"m": True}}}, "fraction in (0, 1]"),
        ({"a": {"channels": ["m"], "shares": {"other": 0.5}}}, "does not serve"),
        ({"a": {"channels": ["m"], "shares": ["m"]}}, "must map channel keys"),
        (
            {"a": {"channels": ["m"], "shares": {"m": 0.7}}, "b": {"channels": ["m"], "shares": {"m": 0.6}}},
            "add up to 1.3",
        ),
    ],
)
def test_share_problems_name_what_is_wrong(lanes, fragment):
    assert any(fragment in p for p in share_problems(lanes)), share_problems(lanes)


def test_a_sound_configuration_has_no_problems():
    assert share_problems(LANES) == []
    assert share_problems({"a": {"channels": ["m"], "shares": {"m": 0.25}}, "b": {"channels": ["m"]}}) == []


def test_the_documented_worked_example():
    lanes = {
        "urgent": {"priorities": [0], "channels": ["email", "sms"], "shares": {"email": 0.75}},
        "bulk": {"channels": ["email"]},
    }
    assert shared_limits(lanes, "urgent", "email", max_concurrency=10, rate_limit=20.0) == (7, 15.0)
    assert shared_limits(lanes, "urgent", "sms", max_concurrency=10, rate_limit=20.0) == (10, 20.0)
    assert shared_limits(lanes, "bulk", "email", max_concurrency=10, rate_limit=20.0) == (5, 10.0)
    assert any("add up to 1.25" in p for p in share_problems(lanes))
    lanes["bulk"]["shares"] = {"email": 0.25}
    assert share_problems(lanes) == []
    assert shared_limits(lanes, "bulk", "email", max_concurrency=10, rate_limit=20.0) == (2, 5.0)


def test_shares_over_the_whole_limit_are_a_settings_error():
    from notifications_retry.conf import RetrySettings, settings_problems

    conf = RetrySettings.from_mapping(
        {
            "LANES": {
                "a": {"channels": ["m"], "shares": {"m": 0.7}},
                "b": {"channels": ["m"], "shares": {"m": 0.6}},
            }
        }
    )
    assert any("add up to 1.3" in p for p in settings_problems(conf))
