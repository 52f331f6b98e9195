"""The shared trainer: parity, loss types, resume, LoRA, accumulation, bad input, model families, VLMs, vLLM, and a
real pretrained model (SmolLM2-135M-Instruct). Tiers (`_support/tiers.py`): training unless named below."""

from _support.tiers import by_model, mark_tier


FILES = {
    "test_base_parity.py": "loss_step",
    "test_loss_types.py": "loss_step",
    "test_bad_input.py": "loss_step",
    "test_model_families.py": "loss_step",
    "test_real_model.py": "loss_step",
    "test_resume_state.py": "loss_step",
    "test_places.py": "loss_step",
    "test_base.py": by_model,
    "test_vllm.py": by_model,
}
# The tests of a file of short runs that run none: loss steps, scoring passes, configs.
QUICK = {
    "test_accumulation.py": (
        "test_half_micro_batches_reproduce_one_micro_batch",
        "test_controller_statistic_is_the_window_token_mean_whatever_the_split",
        "test_micro_batch_controller_ignores_the_window",
    ),
    "test_real_model_demo.py": ("test_smollm2_defaults_and_configs",),
    "test_resume_changes.py": (
        "test_a_learned_value_outside_the_new_range_is_brought_into_it",
        "test_degenerate_measured_target_warns",
        "test_only_tied_weights_are_left_out_of_the_missing_keys_report",
    ),
    "test_schedules.py": (
        "test_the_schedules_values_are_the_formulas",
        "test_each_step_equals_grpo_trainer_with_that_steps_coefficient",
        "test_the_generation_cycle_clock_counts_every_pass_over_the_batch",
        "test_the_bonus_has_a_gradient_wherever_its_coefficient_is_not_zero",
        "test_a_schedule_from_zero_switches_the_bonus_on",
        "test_evaluation_reads_the_current_value_and_moves_nothing",
    ),
    "test_trainer_api.py": (
        "test_another_methods_config_is_refused",
        "test_evaluate_equals_grpo_trainer",
        "test_evaluate_works_for_every_method_and_moves_no_controller",
        "test_the_model_card_names_the_method_and_cites_its_paper_next_to_grpos",
    ),
    "test_vlm.py": (
        "test_loss_and_gradients_equal_grpo_trainer",
        "test_sliced_scoring_equals_grpo_trainer_in_one_pass",
        "test_head_scores_the_completion_positions_as_the_model_s_own_logits",
        "test_image_column_for_a_text_only_model_is_refused",
        "test_image_placeholder_in_a_completion_is_refused",
        "test_image_placeholders_without_images_are_refused",
        "test_image_token_count_that_does_not_match_the_images_is_refused",
        "test_a_model_input_the_head_would_drop_is_refused",
        "test_vlm_without_a_findable_lm_head_is_refused",
    ),
    # One loss step's worth each: what a two-process launch checks, with the second rank stood in.
    "test_resume.py": ("test_a_checkpoints_partial_cycle_sums_come_back_once_over_the_ranks",),
    "test_real_model_training.py": ("test_base_equals_trl_on_a_real_batch",),
}
TESTS = {file: dict.fromkeys(names, "loss_step") for file, names in QUICK.items()}
TESTS["test_base.py"] = {"test_training_on_the_toy_task": "training"}
TESTS["test_vllm.py"] = {"test_training_with_vllm": "training"}
# Short runs kept in the quick loop on purpose: each trains a step or two (or stops at its first generation) to check
# what bad input does to a whole step.
UNCHECKED = {
    "test_bad_input.py": {
        "test_training_through_an_all_masked_step",
        "test_infinite_reward_is_rejected_naming_the_function",
        "test_none_and_nan_rewards_are_handled_as_trl_does",
    },
    "test_model_families.py": {"test_aent_clamped_entropy_is_taken_on_the_transformed_logits"},
}
LAUNCHES = {
    "test_base.py": {
        "test_a_plain_install_brings_neither_triton_nor_liger",
        "test_trl_entropy_train_runs_from_the_wheel_outside_the_clone",
        "test_wheel_installs_kernels_inside_the_package",
        "test_wheel_ships_the_demo_configs_and_requires_the_trl_range_the_import_checks",
    },
    "test_real_model.py": {"test_trl_entropy_train_runs_on_the_real_model_and_a_local_gsm8k_folder"},
    "test_resume.py": {"test_two_process_mid_cycle_resume_equals_the_straight_run"},
    "test_resume_changes.py": {
        "test_kill_inside_the_optimizer_write_is_skipped_on_resume",
        "test_two_process_checkpoint_resumed_by_one_process_regenerates",
    },
    "test_trainer_api.py": {"test_liger_layer_kernels_keep_the_entropy_head"},
}


def pytest_itemcollected(item):
    mark_tier(item, "training", FILES, LAUNCHES, TESTS, UNCHECKED)
