"""Pure functions, configs and source checks, and what reads or trains little: the docs, the report, the toy and the
drift guards. Tiers (`_support/tiers.py`): training unless named below."""

from _support.tiers import by_model, mark_tier


FILES = {
    "test_adding_a_method.py": "pure",
    "test_bf16_clip_flips.py": "pure",
    "test_chat_task.py": "pure",
    "test_config_rules.py": "pure",
    "test_docs.py": "pure",
    "test_doc_budgets.py": "pure",
    "test_drift.py": by_model,
    "test_evaluation.py": by_model,
    "test_method_homes.py": "pure",
    "test_pretrained.py": "pure",
    "test_report.py": "pure",
    "test_rewards.py": "pure",
    "test_rounding.py": "pure",
    "test_schedule_values.py": "pure",
    "test_select_sweep.py": "pure",
    "test_layout.py": "pure",
    "test_layering.py": "pure",
    "test_tiers.py": "pure",
    "test_toy.py": by_model,
    "test_toy_sweep.py": "pure",
    "test_trl_pin.py": "pure",
    "test_upstream_noise.py": "pure",
}


def snippet_tier(item) -> str:
    """A docs snippet that trains is a short run, one that builds a trainer a loss step's cost, any other pure."""
    code = item.callspec.params["code"]
    return "training" if ".train(" in code else "loss_step" if "Trainer(" in code else "pure"


# The short runs of files of quick tests; a source check in a file of short runs; a tiny model's scoring passes in a
# file of pure functions.
TESTS = {
    "test_docs.py": {"test_snippet_runs": snippet_tier},
    "test_drift.py": {
        "test_the_guard_checks_every_parameter_the_bridge_relies_on": "pure",
        "test_a_loss_computed_around_ours_fails_the_first_step": "training",
        "test_rollout_log_probs_from_another_path_fail_loudly": "training",
        "test_the_guards_are_silent_on_the_supported_trl": "training",
        "test_the_rollout_entropy_check_is_silent_on_the_supported_trl": "training",
    },
    "test_evaluation.py": {"test_demo_reports_pass_at_k_the_law_and_phase_2": "training"},
    "test_report.py": {"test_report_on_a_real_run": "training", "test_report_on_several_runs": "training"},
    "test_toy.py": {
        "test_concurrent_processes_warm_start_a_policy_once": "training",
        "test_grpo_trainer_runs_on_toy_task": "training",
        "test_warm_started_policy_succeeds_sometimes": "loss_step",
    },
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
