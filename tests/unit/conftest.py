"""Pure functions, configs and source checks, and what reads or trains little: the docs, the report, the toy and the
drift guards. Tiers (`_support/tiers.py`): training unless named below."""

from _support.tiers import mark_tier


FILES = {
    "test_adding_a_method.py": "pure",
    "test_bf16_clip_flips.py": "pure",
    "test_chat_task.py": "pure",
    "test_pretrained.py": "pure",
    "test_rewards.py": "pure",
    "test_rounding.py": "pure",
    "test_schedule_values.py": "pure",
    "test_select_sweep.py": "pure",
    "test_layout.py": "pure",
    "test_toy_sweep.py": "pure",
    "test_trl_pin.py": "pure",
    "test_upstream_noise.py": "pure",
}
# A source check in a file of short runs; a tiny model's scoring passes in a file of pure functions.
TESTS = {
    "test_drift.py": {"test_the_guard_checks_every_parameter_the_bridge_relies_on": "pure"},
    "test_bf16_clip_flips.py": {
        "test_both_scorings_read_each_completion_token_at_its_position": "loss_step",
        "test_a_batch_measurement_puts_the_weights_back_and_a_zero_step_moves_no_ratio": "loss_step",
    },
}
LAUNCHES = {
    "test_adding_a_method.py": {"test_the_walk_through_method_ships_by_the_pages_steps_and_trains_combined"},
    "test_pretrained.py": {"test_concurrent_callers_convert_once"},
    "test_report.py": {"test_without_matplotlib_the_report_and_the_demo_stop_naming_the_extra"},
    "test_upstream_noise.py": {
        "test_a_short_run_prints_no_upstream_noise_and_our_warning_still_shows",
        "test_importing_the_library_changes_no_warning_or_logging_filter",
    },
}


def pytest_itemcollected(item):
    mark_tier(item, "training", FILES, LAUNCHES, TESTS)
