"""KL-Cov (arXiv:2505.22617, §4.2, eqs. 13–14; docs/kl_cov.md) against the independent float64 reference of
`_support/cov.py`: its selection, loss and gradients, its on-policy warning, training, its selection over the
generation batch."""

import math
import sys
import warnings

import pytest
import torch
from _reference.combined_reference import covariance
from _reference.pairs import PairMethod, PairReference, widest_gap
from _support.cov import (
    LOSS_TYPES,
    Reference,
    assert_same,
    batch,
    clipped_surrogate,
    generation_batch,
    kl_cov_loss_fn,
    on_policy_warnings,
    reference_count,
    reference_pooled_covariance,
    run_training,
    selected_set,
    train_options,
)
from _support.distributed_run import logged, make_trainer
from _support.grpo import loss_and_gradients, toy_config, toy_dataset
from _support.parity import ACCUMULATION

from trl_entropy import EntropyGRPOConfig, EntropyGRPOTrainer
from trl_entropy.methods.kl_cov import KLCovConfig, KLCovTrainer, kl_cov_selection
from trl_entropy.toy import toy_reward


def test_kl_cov_selection_against_sorting():
    generator = torch.Generator().manual_seed(0)
    cov = torch.randn(5, 11, generator=generator)
    mask = torch.ones(5, 11)
    mask[1, 4:] = 0
    mask[3, :] = 0
    cov[3, 0] = 100.0  # the largest value, masked: never chosen
    valid = [(i, t) for i in range(5) for t in range(11) if mask[i, t]]
    for ratio in (1e-3, 0.05, 0.2, 0.5, 1.0):
        count = reference_count(ratio, len(valid))
        expected = set(sorted(valid, key=lambda it: cov[it].item(), reverse=True)[:count])
        assert selected_set(kl_cov_selection(cov, mask, ratio)) == expected
    assert len(selected_set(kl_cov_selection(cov, mask, 0.1))) == math.floor(0.1 * len(valid))  # not 0.1 * 55
    assert not kl_cov_selection(cov, torch.zeros_like(mask), 0.5).any()
    # All-equal advantages: zero covariance everywhere, still k valid tokens.
    chosen = selected_set(kl_cov_selection(torch.zeros(5, 11), mask, 0.1))
    assert len(chosen) == reference_count(0.1, len(valid)) and chosen <= set(valid)


def test_kl_cov_selection_breaks_ties_by_position():
    """Tokens tied at the k-th value: the earliest in row-major order are chosen, whatever the size of the tensor."""
    cov = torch.tensor([[0.5, 2.0, 1.0, 1.0], [1.0, 3.0, 1.0, 0.0]])
    mask = torch.ones(2, 4)
    mask[0, 2] = 0  # a masked tie is skipped
    # 7 valid tokens, k = 4: 3.0, 2.0, then two of the three valid 1.0s, the first two in row-major order.
    assert selected_set(kl_cov_selection(cov, mask, 4 / 7)) == {(1, 1), (0, 1), (0, 3), (1, 0)}
    wide = torch.cat([torch.full((2, 4), -1.0), cov], 1)  # the same tokens in a wider tensor, after lower values
    wide_mask = torch.cat([torch.zeros(2, 4), mask], 1)
    assert selected_set(kl_cov_selection(wide, wide_mask, 4 / 7)) == {(1, 5), (0, 5), (0, 7), (1, 4)}


def test_kl_cov_warns_once_per_trainer_when_fully_on_policy(warm_toy_policy_path, tmp_path):
    """Fully on-policy (the penalty is identically 0): one warning when the trainer is built, none from the config or
    the training steps. Off-policy layouts, none: tests/trainer/test_base.py, for every method."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")  # every occurrence, not once per code location
        toy_config(KLCovConfig, tmp_path)  # steps_per_generation = gradient_accumulation_steps, one iteration
        assert not on_policy_warnings(caught)
        trainer = make_trainer("kl_cov", warm_toy_policy_path, str(tmp_path / "on"), num_iterations=1, max_steps=2)
        assert len(on_policy_warnings(caught)) == 1
        trainer.train()
        assert len(on_policy_warnings(caught)) == 1
    assert len(logged(trainer, "loss")) == 2  # the steps ran


@pytest.mark.parametrize(
    ("trainer_class", "config_class", "options"),
    [(KLCovTrainer, KLCovConfig, {}), (EntropyGRPOTrainer, EntropyGRPOConfig, {"entropy_control": ["kl_cov"]})],
    ids=["own", "combined"],
)
def test_the_on_policy_warning_names_the_line_that_builds_the_trainer(
    toy_model_path, tmp_path, trainer_class, config_class, options
):
    """The trainer builds KL-Cov's part, which warns (core/warn.py): at the user's line, not the library's."""
    args = toy_config(config_class, tmp_path, **options)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        line = sys._getframe().f_lineno + 1
        trainer_class(model=toy_model_path, reward_funcs=toy_reward, args=args, train_dataset=toy_dataset(8))
    (warned,) = on_policy_warnings(caught)
    assert (warned.filename, warned.lineno) == (__file__, line)


# ---------------------------------------------------------------------------------------------------------------------

# KL-Cov: loss and gradients
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("loss_type, beta", [("grpo", 0.04), ("bnpo", 0.0), ("dr_grpo", 0.04), ("dapo", 0.0)])
def test_kl_cov_loss_and_gradients(toy_model_path, toy_tokenizer, loss_type, beta, toy_trainer_of):
    inputs = batch(toy_model_path, toy_tokenizer, seed=30 + LOSS_TYPES.index(loss_type), old_noise=0.4)
    reference = Reference(toy_model_path, inputs)
    num_valid = len(reference.valid)
    ratio = 0.3
    count = reference_count(ratio, num_valid)
    ranked = sorted(reference.valid, key=lambda token: reference.cov[token], reverse=True)
    assert reference.cov[ranked[count - 1]] - reference.cov[ranked[count]] > 1e-5  # no near-tie at the cut
    penalised = set(ranked[:count])
    assert any(reference.clip_active(*token) for token in reference.valid), (
        "no clipped token: KL-Cov's no-clip untested"
    )
    coef = 0.7
    trainer = toy_trainer_of(
        "kl_cov",
        accumulation=ACCUMULATION,
        loss_type=loss_type,
        beta=beta,
        num_iterations=2,
        kl_cov_ratio=ratio,
        kl_cov_coef=coef,
    )
    loss, gradients = loss_and_gradients(trainer, inputs)
    expected_loss, expected_gradients = reference.loss_and_gradients(
        kl_cov_loss_fn(penalised, coef), loss_type, 6, beta=beta
    )
    assert_same(loss, gradients, expected_loss, expected_gradients)
    assert trainer._metrics["train"]["kl_cov/penalised_fraction"] == [pytest.approx(count / num_valid)]
    abs_log_ratio = (reference.detached_log_probs - reference.old).abs()  # over the valid tokens: padding left out
    mean_abs_log_ratio = float((abs_log_ratio * reference.mask).sum() / reference.mask.sum())
    assert trainer._metrics["train"]["kl_cov/abs_log_ratio"] == [pytest.approx(mean_abs_log_ratio, rel=1e-5)]
    # The penalty matters in this case: without it the loss differs.
    unpenalised_loss = reference.loss(kl_cov_loss_fn(set(), coef), loss_type, 6, beta=beta)
    assert abs(unpenalised_loss - expected_loss) > 1e-4


def test_kl_cov_equal_advantages_penalises_one_zero_covariance_token(toy_model_path, toy_tokenizer, toy_trainer_of):
    """Zero covariance everywhere: KL-Cov still penalises k = 1 valid token (any of them)."""
    inputs = batch(toy_model_path, toy_tokenizer, seed=40, old_noise=0.4)
    inputs["advantages"] = torch.full_like(inputs["advantages"], -0.3)
    reference = Reference(toy_model_path, inputs)
    assert max(abs(c) for c in reference.cov.values()) < 1e-12
    trainer = toy_trainer_of("kl_cov", accumulation=ACCUMULATION, loss_type="bnpo", num_iterations=2)
    loss, _ = loss_and_gradients(trainer, inputs)
    options = [reference.loss(kl_cov_loss_fn({t}, 1.0), "bnpo", 6) for t in reference.valid]
    assert min(abs(value - loss.double()) for value in options) < 1e-6
    assert trainer._metrics["train"]["kl_cov/penalised_fraction"] == [pytest.approx(1 / len(reference.valid))]


def test_kl_cov_without_penalty_is_unclipped_policy_gradient(toy_model_path, toy_tokenizer, toy_trainer_of):
    """kl_cov_coef = 0: −A·r for every token, which differs from GRPO's clipped loss when some ratio is clipped."""
    inputs = batch(toy_model_path, toy_tokenizer, seed=41, old_noise=0.4)
    reference = Reference(toy_model_path, inputs)
    trainer = toy_trainer_of("kl_cov", accumulation=ACCUMULATION, loss_type="dapo", num_iterations=2, kl_cov_coef=0.0)
    loss, gradients = loss_and_gradients(trainer, inputs)
    expected_loss, expected_gradients = reference.loss_and_gradients(kl_cov_loss_fn(set(), 0.0), "dapo", 6)
    assert_same(loss, gradients, expected_loss, expected_gradients)
    clipped_loss = reference.loss(lambda lp, old, r, a: clipped_surrogate(r, a), "dapo", 6)
    assert abs(clipped_loss - expected_loss) > 1e-4


# ---------------------------------------------------------------------------------------------------------------------


def test_kl_cov_trains_end_to_end(warm_toy_policy_path, tmp_path):
    config = KLCovConfig(**train_options(tmp_path, "kl", kl_cov_ratio=0.05, num_iterations=2))
    trainer = run_training(KLCovTrainer, config, warm_toy_policy_path)
    fractions = logged(trainer, "kl_cov/penalised_fraction")
    assert len(fractions) == 3 and all(0 < f <= 0.5 for f in fractions)
    assert any(value > 0 for value in logged(trainer, "kl_cov/abs_log_ratio"))  # the second iteration is off-policy
    assert len(logged(trainer, "entropy/cov_logp_adv")) == 3


@pytest.mark.parametrize("on_policy", [True, False], ids=["on_policy", "off_policy"])
def test_kl_cov_generation_batch_selection_equals_float64_reference(
    toy_model_path, toy_tokenizer, on_policy, toy_trainer_of
):
    """The top k of the whole generation batch by Cov_t from ℓ^old, centred over the whole batch."""
    inputs = generation_batch(toy_model_path, toy_tokenizer, seed=60, on_policy=on_policy)
    cov = reference_pooled_covariance(toy_model_path, inputs)
    ratio = 0.2
    count = reference_count(ratio, len(cov))
    ranked = sorted(cov, key=lambda token: cov[token], reverse=True)
    assert cov[ranked[count - 1]] - cov[ranked[count]] > 1e-5  # no near-tie at the cut
    trainer = toy_trainer_of(
        "kl_cov",
        accumulation=ACCUMULATION,
        num_iterations=2,
        kl_cov_ratio=ratio,
        cov_selection_scope="generation_batch",
    )
    selected = trainer.part("kl_cov").select_over_generation_batch(dict(inputs))
    assert selected.shape == inputs["completion_mask"].shape
    assert selected_set(selected) == set(ranked[:count])
    # The micro-batch rule on each half (its own means, its own k) picks other tokens: the pooling matters.
    per_half = set()
    for start in (0, 4):
        half = {
            key: value[start : start + 4] for key, value in inputs.items() if torch.is_tensor(value) and value.dim()
        }
        half_cov = reference_pooled_covariance(toy_model_path, half)
        half_ranked = sorted(half_cov, key=lambda token: half_cov[token], reverse=True)
        per_half |= {(i + start, t) for i, t in half_ranked[: reference_count(ratio, len(half_cov))]}
    assert per_half != set(ranked[:count])


# The pair table's piece (tests/compose/test_pairs.py): its surrogate, which has no PPO clip, and its share.


def pair_top_by_covariance(cov, mask, fraction):
    """The top ``max(⌊fraction · valid⌋, 1)`` valid tokens by covariance."""
    count = max(math.floor(fraction * int(mask.sum())), 1)
    values = cov[mask.bool()].sort(descending=True).values
    return (cov >= values[count - 1]) & mask.bool()


def pair_kl_cov_surrogate(log_probs, old_log_probs, advantages, mask, s):
    """KL-Cov (arXiv:2505.22617, §4.2): ``−A·r`` plus ``β_KL·|ℓ − ℓ^old|`` on the top-κ tokens by covariance."""
    ratio = torch.exp(log_probs - old_log_probs)
    selected = pair_top_by_covariance(covariance(log_probs, advantages, mask), mask, s["kl_cov_ratio"])
    return -advantages * ratio + s["kl_cov_coef"] * (log_probs - old_log_probs).abs() * selected


def pair_kl_cov_share(log_probs, advantages, mask):
    """The share of the tokens above the widest gap of the batch's covariances with the pair's token advantages."""
    _, above = widest_gap(covariance(log_probs, advantages, mask)[mask.bool()])
    return dict(kl_cov_ratio=(above + 0.5) / int(mask.bool().sum()))


PAIR = PairReference(
    settings=dict(kl_cov_coef=1.0),
    methods={
        "kl_cov": PairMethod(
            "surrogate", replaces_clip=True, surrogate=pair_kl_cov_surrogate, thresholds=pair_kl_cov_share
        )
    },
)
