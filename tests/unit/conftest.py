"""Pure functions, configs and source checks, and what reads or trains little: the docs, the report, the toy and the
drift guards. Tiers (`_support/tiers.py`): training unless named below."""

from _support.tiers import mark_tier


FILES = {
    "test_rewards.py": "pure",
    "test_rounding.py": "pure",
    "test_layout.py": "pure",
    "test_toy_sweep.py": "pure",
    "test_upstream_noise.py": "pure",
}
LAUNCHES = {
    "test_report.py": {"test_without_matplotlib_the_report_and_the_demo_stop_naming_the_extra"},
    "test_upstream_noise.py": {"test_a_short_run_prints_no_upstream_noise_and_our_warning_still_shows"},
}


def pytest_itemcollected(item):
    mark_tier(item, "training", FILES, LAUNCHES)
