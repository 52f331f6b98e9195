"""Methods combined: every pair against float64 and its refusals, combined runs against single-method ones, resume
and the two-process run. Tiers (`_support/tiers.py`): training unless named below."""

from _support.tiers import mark_tier


FILES = {"test_pairs.py": "loss_step", "test_command_line.py": "pure"}
LAUNCHES = {}
# Two loss steps per case, one of each trainer.
TESTS = {"test_combined_runs.py": {"test_a_combination_with_one_method_neutral_equals_the_other_alone": "loss_step"}}


def pytest_itemcollected(item):
    mark_tier(item, "training", FILES, LAUNCHES, TESTS)
