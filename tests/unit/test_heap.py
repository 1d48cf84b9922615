"""The worker's collector settings (retry_worker's prepare_for_long_run), on this process's own collector,
restored after each test."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from notifications_retry.management.commands.retry_worker import YOUNG_THRESHOLD, prepare_for_long_run


@pytest.fixture(autouse=True)
def restore_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.set_threshold(*thresholds)
    gc.unfreeze()


def test_the_default_young_threshold_is_raised_and_the_loaded_heap_frozen():
    gc.unfreeze()
    gc.set_threshold(700, 10, 10)
    prepare_for_long_run()
    assert gc.get_threshold() == (YOUNG_THRESHOLD, 10, 10)
    assert gc.get_freeze_count() > 0  # what was loaded is no longer walked by the collector


def test_a_threshold_the_project_set_higher_or_switched_off_is_kept():
    gc.set_threshold(YOUNG_THRESHOLD * 5, 20, 30)
    prepare_for_long_run()
    assert gc.get_threshold() == (YOUNG_THRESHOLD * 5, 20, 30)
    gc.set_threshold(0, 10, 10)  # 0: no automatic collection
    prepare_for_long_run()
    assert gc.get_threshold() == (0, 10, 10)
