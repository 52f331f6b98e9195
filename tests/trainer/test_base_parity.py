"""With control off, EntropyGRPOTrainer's loss and gradients equal trl.GRPOTrainer's on identical inputs."""

import itertools

import pytest
from _support.grpo import make_grpo_batch
from _support.parity import assert_same_step, build_pair


CASES = list(itertools.product(["grpo", "bnpo", "dr_grpo", "dapo"], [0.0, 0.04], ["token", "sequence"], [True, False]))


@pytest.mark.parametrize("loss_type, beta, level, with_old", CASES)
def test_loss_and_gradients_equal_grpo_trainer(
    toy_model_path, toy_tokenizer, tmp_path, loss_type, beta, level, with_old
):
    trl_trainer, our_trainer = build_pair(
        toy_model_path, toy_tokenizer, tmp_path, loss_type=loss_type, beta=beta, importance_sampling_level=level
    )
    inputs = make_grpo_batch(
        trl_trainer.model,
        len(toy_tokenizer),
        seed=CASES.index((loss_type, beta, level, with_old)),
        old_noise=0.3 if with_old else None,
    )
    assert_same_step(trl_trainer, our_trainer, inputs)
    # The metrics TRL logs are ours too, with the same values.
    for key in ("entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean") + (
        ("kl",) if beta else ()
    ):
        assert our_trainer._metrics["train"][key] == pytest.approx(
            trl_trainer._metrics["train"][key], rel=1e-5, abs=1e-7
        )


@pytest.mark.parametrize(
    "options",
    [
        {"entropy_coef": 0.05},
        {"entropy_coef": 0.05, "use_adaptive_entropy": True, "entropy_target": 10.0},
        {"top_entropy_quantile": 0.5},
        {"delta": 1.1},
        {"off_policy_mask_threshold": 0.05},
        {"beta": 0.04, "use_bias_correction_kl": True},
        {"epsilon": 0.1, "epsilon_high": 0.3},
    ],
    ids=lambda options: ",".join(options),
)
def test_grpo_options_equal_grpo_trainer(toy_model_path, toy_tokenizer, tmp_path, options):
    trl_trainer, our_trainer = build_pair(toy_model_path, toy_tokenizer, tmp_path, **options)
    # Two optimizer-step windows of two micro-batches: the adaptive entropy coefficient moves between them.
    for seed, sync in ((1, False), (2, True), (3, False), (4, True)):
        inputs = make_grpo_batch(trl_trainer.model, len(toy_tokenizer), seed=seed)
        for trainer in (trl_trainer, our_trainer):
            trainer.accelerator.gradient_state._set_sync_gradients(sync)
        assert_same_step(trl_trainer, our_trainer, inputs)
        assert our_trainer.entropy_coef == pytest.approx(trl_trainer.entropy_coef)


def test_bonus_coefficient_moves_like_trl(toy_model_path, toy_tokenizer, tmp_path):
    """TRL's adaptive entropy bonus (the EntReg baseline) keeps its own trajectory under the base."""
    trl_trainer, our_trainer = build_pair(
        toy_model_path, toy_tokenizer, tmp_path, entropy_coef=0.01, use_adaptive_entropy=True, entropy_target=100.0
    )
    for seed in range(3):
        inputs = make_grpo_batch(trl_trainer.model, len(toy_tokenizer), seed=seed)
        for trainer in (trl_trainer, our_trainer):
            trainer.compute_loss(trainer.model, dict(inputs))
    # Entropy (≤ log V) is below the target at every step: three increments of entropy_coef_delta.
    assert our_trainer.entropy_coef == pytest.approx(0.01 + 3 * 0.005)
    assert trl_trainer.entropy_coef == pytest.approx(our_trainer.entropy_coef)
