"""The shared trainer: parity, loss types, resume, LoRA, accumulation, bad input, model families, VLMs, vLLM, and a
real pretrained model (SmolLM2-135M-Instruct). Tiers (`_support/tiers.py`): training unless named below."""

from _support.tiers import mark_tier


FILES = {
    "test_base_parity.py": "loss_step",
    "test_loss_types.py": "loss_step",
    "test_bad_input.py": "loss_step",
    "test_model_families.py": "loss_step",
    "test_real_model.py": "loss_step",
}
# One loss step's worth each, in the quick loop: what a two-process launch checks, with the second rank stood in.
TESTS = {
    "test_schedules.py": {
        name: "loss_step"
        for name in (
            "test_the_schedules_values_are_the_formulas",
            "test_each_step_equals_grpo_trainer_with_that_steps_coefficient",
            "test_the_bonus_has_a_gradient_wherever_its_coefficient_is_not_zero",
            "test_a_schedule_from_zero_switches_the_bonus_on",
            "test_evaluation_reads_the_current_value_and_moves_nothing",
        )
    },
    "test_resume.py": {"test_a_checkpoints_partial_cycle_sums_come_back_once_over_the_ranks": "loss_step"},
    "test_real_model_training.py": {"test_base_equals_trl_on_a_real_batch": "loss_step"},
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
    mark_tier(item, "training", FILES, LAUNCHES, TESTS)
