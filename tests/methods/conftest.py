"""One file per method: its math against float64, its trainer against trl.GRPOTrainer, short training. Tiers
(`_support/tiers.py`): training unless named below."""

from _support.tiers import mark_tier


FILES = {}
# One loss step each, in the quick loop: what a two-process launch checks, with the second rank stood in.
TESTS = {"test_entropic.py": {"test_alpha_and_the_token_sum_normaliser_take_every_ranks_tokens": "loss_step"}}
LAUNCHES = {
    "test_cov_selection.py": {"test_two_processes_select_and_train_like_one"},
    "test_entropic.py": {"test_every_rank_holds_the_float64_replay_of_the_world_micro_batches"},
}


def pytest_itemcollected(item):
    mark_tier(item, "training", FILES, LAUNCHES, TESTS)
