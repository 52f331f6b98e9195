"""Multi-process runs, the example scripts as processes, the GPU runbook's dry run and the real-model step benchmark's,
the two ranks' end with their owner, the watchdog. Tiers (`_support/tiers.py`): training unless named below."""

from _support.tiers import mark_tier


FILES = {}
LAUNCHES = {
    "test_distributed.py": "all",
    "test_vlm_distributed.py": "all",
    "test_gpu_runbook.py": "all",
    "test_step_bench.py": "all",
    "test_rank_pool_ends_with_its_owner.py": "all",
    "test_watchdog.py": "all",
    "test_examples.py": {
        "test_train_command_line_error_as_a_process",
        "test_train_real_model_on_a_local_math_dataset",
        "test_train_runs_every_method",
        "test_train_use_peft_trains_a_lora_adapter",
        "test_train_yaml_config_and_command_line_override",
        "test_train_vlm_on_a_local_image_question_dataset",
    },
}


# In-process checks of the scripts' arguments, data and defaults.
TESTS = {
    "test_examples.py": dict.fromkeys(
        (
            "test_demo_intervals_are_the_bootstrap_of_each_problem_and_seed",
            "test_demo_rejects_bad_runs",
            "test_examples_hide_only_known_upstream_warnings",
            "test_real_math_dataset_keeps_the_image_column_as_trl_s_image",
            "test_real_math_dataset_reads_gsm8k_and_math_columns",
            "test_the_toy_policy_is_cached_where_the_run_saves",
            "test_toy_training_set_repeats_a_fixed_pool",
            "test_train_command_line_errors",
            "test_train_default_output_dir_per_kind_of_run",
            "test_train_help_shows_the_method_first",
            "test_train_precision_without_a_bf16_gpu",
            "test_train_toy_defaults_apply_only_without_a_model",
        ),
        "pure",
    )
}


def pytest_itemcollected(item):
    mark_tier(item, "training", FILES, LAUNCHES, TESTS)
