"""One file per method: its math against float64, its trainer against trl.GRPOTrainer, short training. Tiers
(`_support/tiers.py`): by cost, whatever the folder: a test given a model is one loss step's (`loss_step`), one without
is `pure`, and the tests that train are named below."""

from _support.tiers import by_model, mark_tier


TRAINING = {
    "test_aent.py": (
        "test_train_logs_aent_metrics",
        "test_the_coefficient_follows_the_float64_replay_with_each_steps_band_and_box",
        "test_a_resumed_scheduled_run_continues_the_coefficient_and_band_sequences",
        "test_a_changed_band_schedule_on_resume_is_named",
    ),
    "test_clip_cov.py": ("test_clip_cov_trains_end_to_end", "test_clip_cov_generator_state_in_checkpoints"),
    "test_cov_selection.py": (
        "test_selection_and_weights_do_not_depend_on_accumulation",
        "test_generation_scope_resume_reproduces_the_straight_run",
    ),
    "test_entrocraft.py": ("test_the_previous_cycles_entropy_is_measured_and_read_one_cycle_late",),
    "test_entropic.py": ("test_one_process_controller_is_the_float64_replay_of_its_micro_batches",),
    "test_erc.py": (
        "test_the_carried_rollout_entropy_is_the_rollout_policys_in_every_layout",
        "test_trainers_that_do_not_read_the_rollout_entropy_carry_none",
        "test_erc_keeps_the_rollout_entropy_from_the_rollout_log_prob_pass_only",
        "test_a_mid_cycle_resume_carries_the_rollout_entropy_exactly",
    ),
    "test_kl_cov.py": ("test_kl_cov_warns_once_per_trainer_when_fully_on_policy", "test_kl_cov_trains_end_to_end"),
    "test_qae.py": (
        "test_mean_baseline_reproduces_trls_advantages",
        "test_generation_batch_carries_the_formulas_advantages",
    ),
    "test_siren.py": (
        "test_the_anchor_is_measured_once_on_the_first_batch_under_the_rollout_policy",
        "test_a_resumed_run_keeps_the_anchor_and_never_measures_again",
        "test_a_given_anchor_is_never_measured",
        "test_the_coefficient_follows_its_schedule",
    ),
}
TESTS = {file: dict.fromkeys(names, "training") for file, names in TRAINING.items()}
# One loss step each, in the quick loop: what a two-process launch checks, with the second rank stood in.
TESTS["test_entropic.py"]["test_alpha_and_the_token_sum_normaliser_take_every_ranks_tokens"] = "loss_step"
LAUNCHES = {
    "test_cov_selection.py": {"test_two_processes_select_and_train_like_one"},
    "test_entropic.py": {"test_every_rank_holds_the_float64_replay_of_the_world_micro_batches"},
}


def pytest_itemcollected(item):
    mark_tier(item, by_model, None, LAUNCHES, TESTS)
