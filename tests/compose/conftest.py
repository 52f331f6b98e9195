"""Methods combined: every pair against float64 and its refusals, combined runs against single-method ones, resume
and the two-process run. Tiers (`_support/tiers.py`): training unless named below."""

from _support.tiers import mark_tier


FILES = {"test_pairs.py": "loss_step", "test_command_line.py": "pure"}
LAUNCHES = {}


def pytest_itemcollected(item):
    mark_tier(item, "training", FILES, LAUNCHES)
