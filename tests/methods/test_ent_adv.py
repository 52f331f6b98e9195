"""Entropy-based advantage shaping (Cheng et al., "Reasoning with Exploration: An Entropy Perspective",
arXiv:2506.14758; docs/ent_adv.md): the worked example number for number, the shaped advantage against the formula
written out in float64, its edge cases and bad values, and the trainer's loss, gradients and metrics against
trl.GRPOTrainer fed the float64 shaped advantages for every loss type, against a float64 loss written out here, and,
with α = 0, against trl.GRPOTrainer itself. The shared suites (LoRA, trainer API, loss types, bad input, model cards,
report panels, docs) cover it through the registry."""

import math
import re

import pytest
import torch
from _reference.float64_policy import assert_step_is_float64, completion_log_probs, float64_model
from _reference.pairs import PairMethod, PairReference
from _support.grpo import (
    build_trainer,
    loss_and_gradients,
    make_grpo_batch,
    naive_entropy,
    toy_config,
)
from _support.parity import TRL, assert_same_step

from trl_entropy.core.batch import CompletionBatch
from trl_entropy.core.trl.objectives import LOSS_TYPES
from trl_entropy.methods.ent_adv import (
    EntropyAdvantageConfig,
    entropy_bonus,
    entropy_shaped_advantages,
)


def shaped(advantage: float, entropy: float, alpha: float, kappa: float) -> float:
    """The paper's shaped advantage, written out: A' = A + min(α·H, |A|/κ), H detached."""
    return advantage + min(alpha * entropy, abs(advantage) / kappa)


# ---------------------------------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------------------------------


def test_defaults_are_the_papers_grpo_setting_and_zero_alpha_is_allowed():
    config = toy_config(EntropyAdvantageConfig)
    assert (config.ent_adv_alpha, config.ent_adv_kappa) == (0.4, 2.0)
    assert toy_config(EntropyAdvantageConfig, ent_adv_alpha=0.0).ent_adv_alpha == 0.0  # the neutral setting
    assert toy_config(EntropyAdvantageConfig, ent_adv_kappa=1.0001).ent_adv_kappa == 1.0001


BAD_VALUES = [("ent_adv_kappa", value) for value in (1, 1.0, 0.5, 0, -2.0, math.nan, math.inf, True, "2")] + [
    ("ent_adv_alpha", value) for value in (-0.1, -1e-12, math.nan, math.inf, True, "0.4")
]


@pytest.mark.parametrize("name, value", BAD_VALUES, ids=[f"{n}={v!r}" for n, v in BAD_VALUES])
def test_bad_values_are_refused_by_name(name, value):
    with pytest.raises(ValueError, match=re.escape(f"{name}={value!r} is invalid")):
        toy_config(EntropyAdvantageConfig, **{name: value})


@pytest.mark.parametrize("option", [{"entropy_coef": 0.01}, {"use_adaptive_entropy": True}])
def test_trl_entropy_bonus_next_to_the_shaping_is_refused(option):
    with pytest.raises(ValueError, match=f"EntropyAdvantage .*{next(iter(option))}"):
        toy_config(EntropyAdvantageConfig, **option)


# ---------------------------------------------------------------------------------------------------------------------
# The shaped advantage
# ---------------------------------------------------------------------------------------------------------------------

EXAMPLE_ADVANTAGES = [1.0, 1.0, -1.0, 0.0]
EXAMPLE_ENTROPIES = [0.5, 3.0, 2.0, 1.5]
EXAMPLE_SHAPED = [1.2, 1.5, -0.5, 0.0]  # α = 0.4, κ = 2: α·H = [0.2, 1.2, 0.8, 0.6], |A|/κ = [0.5, 0.5, 0.5, 0]


def test_worked_example_shaped_advantages():
    advantages = torch.tensor([EXAMPLE_ADVANTAGES])
    result = entropy_shaped_advantages(advantages, torch.tensor([EXAMPLE_ENTROPIES]), 0.4, 2.0)
    torch.testing.assert_close(result, torch.tensor([EXAMPLE_SHAPED]), rtol=0, atol=1e-7)
    bonus = entropy_bonus(advantages, torch.tensor([EXAMPLE_ENTROPIES]), 0.4, 2.0)
    torch.testing.assert_close(bonus, torch.tensor([[0.2, 0.5, 0.5, 0.0]]), rtol=0, atol=1e-7)


@pytest.fixture(scope="module")
def grpo_trainer(toy_model_path, toy_tokenizer, tmp_path_factory):
    return build_trainer(
        "ent_adv",
        toy_model_path,
        toy_tokenizer,
        tmp_path_factory.mktemp("ent_adv"),
        delta=3.0,  # TRL's two-sided clip: A' replaces A in it too
    )


def example_batch(trainer, ratios):
    """The worked example as one completion of four tokens with per-token advantages, through the trainer's hooks."""
    log_probs = torch.full((1, 4), -1.0, requires_grad=True)
    old_log_probs = log_probs.detach() - torch.tensor([ratios]).log()
    entropy = torch.tensor([EXAMPLE_ENTROPIES], requires_grad=True)  # differentiable, as the loss step's is
    return CompletionBatch(
        log_probs=log_probs,
        old_log_probs=old_log_probs,
        entropy=entropy,
        clamped_entropy=None,
        mask=torch.ones(1, 4),
        group_advantages=torch.tensor([EXAMPLE_ADVANTAGES]),
    )


# Ratios 1 (on-policy), then ratios that put each token in another branch of the clipped surrogate with ε = 0.2, δ = 3:
# token 1 clipped high (A' > 0, r = 1.5 > 1.2), token 2 inside, token 3 clipped low (A' < 0, r = 0.5 < 0.8), token 4
# (A' = 0) far out; then token 3 capped by δ (A' < 0, r = 5 > δ). Loss: the token mean of −min(min(r, δ)·A',
# clip(r)·A'); gradient with respect to ℓ: −r·A'/4 where r·A' is the smaller term (and r < δ), else 0.
EXAMPLE_CASES = {
    "on_policy": ([1.0, 1.0, 1.0, 1.0], -(1.2 + 1.5 - 0.5 + 0.0) / 4, [-1.2 / 4, -1.5 / 4, 0.5 / 4, 0.0]),
    "clipped": ([1.5, 1.1, 0.5, 4.0], -(1.2 * 1.2 + 1.1 * 1.5 - 0.8 * 0.5 + 0.0) / 4, [0.0, -1.1 * 1.5 / 4, 0.0, 0.0]),
    "dual_clip": ([1.0, 1.0, 5.0, 1.0], -(1.2 + 1.5 - 3.0 * 0.5 + 0.0) / 4, [-1.2 / 4, -1.5 / 4, 0.0, 0.0]),
}


@pytest.mark.parametrize("case", EXAMPLE_CASES)
def test_worked_example_loss_gradient_and_metrics_through_the_trainer(grpo_trainer, case):
    ratios, loss, gradient = EXAMPLE_CASES[case]
    batch = example_batch(grpo_trainer, ratios)
    stored = batch.group_advantages.clone()
    metrics = grpo_trainer._metrics["train"]
    metrics.clear()
    measured = []
    advantages = grpo_trainer.token_advantages(batch, measured)
    grpo_trainer.record_metrics(batch.mode, measured)
    torch.testing.assert_close(advantages, torch.tensor([EXAMPLE_SHAPED]), rtol=0, atol=1e-6)
    assert not advantages.requires_grad
    assert torch.equal(batch.group_advantages, stored)  # out of place
    ratio = torch.exp(batch.log_probs - batch.old_log_probs)
    per_token = grpo_trainer.surrogate(batch, ratio, advantages, grpo_trainer.clip_range(), [])
    total = per_token.mean()  # one completion, four valid tokens: grpo's mean per sequence
    total.backward()
    assert total.item() == pytest.approx(loss, abs=1e-6)
    torch.testing.assert_close(batch.log_probs.grad, torch.tensor([gradient]), rtol=0, atol=1e-6)
    assert batch.entropy.grad is None or torch.all(batch.entropy.grad == 0)  # H_t is detached
    # Mean bonus over the valid tokens: (0.2 + 0.5 + 0.5 + 0) / 4; capped: tokens 2 and 3 of the three with A ≠ 0.
    assert metrics["ent_adv/mean_bonus"] == [pytest.approx(0.3, abs=1e-6)]
    assert metrics["ent_adv/capped_fraction"] == [pytest.approx(2 / 3, abs=1e-6)]


ALPHAS_KAPPAS = [(0.4, 2.0), (0.1, 2.0), (1.0, 1.5), (0.05, 10.0), (0.0, 2.0)]


@pytest.mark.parametrize("alpha, kappa", ALPHAS_KAPPAS)
@pytest.mark.parametrize("per_token", [False, True], ids=["sequence_advantages", "token_advantages"])
def test_shaped_advantages_follow_the_formula_in_float64(alpha, kappa, per_token):
    generator = torch.Generator().manual_seed(0)
    rows, tokens = 6, 7
    advantages = torch.randn(rows, tokens if per_token else 1, generator=generator, dtype=torch.float64) * 2
    advantages[0] = 0.0  # a group whose rewards are all equal
    entropy = torch.rand(rows, tokens, generator=generator, dtype=torch.float64) * 5
    entropy[1, :3] = 0.0  # a deterministic position
    given = advantages.clone()
    result = entropy_shaped_advantages(advantages, entropy.requires_grad_(), alpha, kappa)
    expected = [
        [
            shaped(advantages[i, j if per_token else 0].item(), entropy[i, j].item(), alpha, kappa)
            for j in range(tokens)
        ]
        for i in range(rows)
    ]
    assert result.shape == (rows, tokens) and not result.requires_grad
    torch.testing.assert_close(result, torch.tensor(expected, dtype=torch.float64), rtol=1e-15, atol=1e-15)
    assert torch.equal(advantages, given)  # out of place
    if not per_token:  # per-sequence advantages given as (B,) are (B, 1)
        one_dimensional = entropy_shaped_advantages(advantages.squeeze(1), entropy, alpha, kappa)
        torch.testing.assert_close(one_dimensional, result, rtol=0, atol=0)


def test_edge_cases_zero_entropy_zero_advantage_and_the_sign():
    advantages = torch.tensor([[-3.0], [-0.5], [0.0], [0.7]], dtype=torch.float64)
    entropy = torch.tensor([[0.0, 1e-3, 1.0, 10.0, 1e6]], dtype=torch.float64).expand(4, 5)
    for alpha in (0.0, 0.1, 0.4, 5.0):
        for kappa in (1.01, 2.0, 7.0):
            result = entropy_shaped_advantages(advantages, entropy, alpha, kappa)
            torch.testing.assert_close(result[:, :1], advantages, rtol=0, atol=0)  # H = 0: unchanged
            assert torch.all(result[2] == 0)  # A = 0: unchanged
            low, high = advantages, advantages * (1 - 1 / kappa)  # A < 0: A' ∈ [A, A(1 − 1/κ)], still negative
            assert torch.all((result[:2] >= low[:2]) & (result[:2] <= high[:2]) & (result[:2] < 0))
            assert torch.all((result[3] >= 0.7) & (result[3] <= 0.7 * (1 + 1 / kappa)))  # A > 0: at most A(1 + 1/κ)
            if alpha > 0:  # an entropy far above |A|/(ακ): the cap is reached exactly
                torch.testing.assert_close(result[:, -1:], advantages + advantages.abs() / kappa)
            else:
                torch.testing.assert_close(result, advantages.expand(4, 5), rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------------------------------
# Trainer: loss, gradients and metrics on a real batch
# ---------------------------------------------------------------------------------------------------------------------

# By construction, with α = 0.1 and the toy model's entropy near 3.8 nats (α·H ≈ 0.38): the second completion is capped
# (|A|/κ = 0.25), the first and last are not (0.45, 0.8), the third has A = 0. Every margin is far above rounding.
ADVANTAGES = torch.tensor([0.9, -0.5, 0.0, -1.6])
ALPHA, KAPPA = 0.1, 2.0
# Loss types with their options: the clipped ones with TRL's dual clip (delta) or the sequence-level ratio, CISPO with
# an ε_max low enough to truncate the noisy ratios.
LOSS_CASES = {
    "grpo": {"delta": 1.2},
    "bnpo": {"beta": 0.04},
    "dr_grpo": {},
    "dapo": {"importance_sampling_level": "sequence"},
    "cispo": {"epsilon_high": 1.2},
    "sapo": {},
    "luspo": {"importance_sampling_level": "sequence"},
    "vespo": {},
}
assert set(LOSS_CASES) == set(LOSS_TYPES)  # every loss type: the shaping refuses none


def real_batch(model, tokenizer, seed):
    inputs = make_grpo_batch(model, len(tokenizer), seed=seed)
    inputs["advantages"] = ADVANTAGES.clone()
    return inputs


def float64_shaped(model, inputs, alpha=ALPHA, kappa=KAPPA):
    """A'_t in float64 from the float64 entropy of the same forward pass, and which tokens the cap binds."""
    entropy = naive_entropy(model, inputs)
    advantages = inputs["advantages"].double().unsqueeze(1)
    values = [
        [shaped(a.item(), h, alpha, kappa) for h in row.tolist()] for a, row in zip(advantages, entropy, strict=True)
    ]
    margin = (alpha * entropy - advantages.abs() / kappa).abs().min().item()
    return torch.tensor(values, dtype=torch.float64), advantages.abs() / kappa < alpha * entropy, margin


@pytest.mark.parametrize("loss_type", LOSS_CASES)
def test_loss_gradients_and_metrics_equal_grpo_trainer_fed_the_float64_shaped_advantages(
    toy_tokenizer, cached_trl_trainer, loss_type, toy_trainer_of
):
    options = {"loss_type": loss_type, **LOSS_CASES[loss_type]}
    ours = toy_trainer_of("ent_adv", "ours", ent_adv_alpha=ALPHA, ent_adv_kappa=KAPPA, **options)
    trl_trainer = cached_trl_trainer(**options)
    inputs = real_batch(trl_trainer.model, toy_tokenizer, seed=list(LOSS_CASES).index(loss_type))
    expected, capped, margin = float64_shaped(trl_trainer.model, inputs)
    assert margin > 1e-2, "a token sits on the cap: the case is not well posed"
    mask = inputs["completion_mask"].double()
    valid_capped = capped[1].double() * mask[1]
    assert 0 < valid_capped.sum() and (capped[[0, 3]] == 0).all(), "the case must hold capped and uncapped tokens"

    our_loss, our_grads = loss_and_gradients(ours, inputs)
    assert torch.equal(inputs["advantages"], ADVANTAGES)  # the stored advantages are never written
    trl_loss, trl_grads = loss_and_gradients(trl_trainer, dict(inputs, advantages=expected.float()))
    torch.testing.assert_close(our_loss, trl_loss, rtol=1e-5, atol=1e-7)
    assert set(our_grads) == set(trl_grads)
    assert any(g.abs().max() > 0 for g in trl_grads.values())
    for name in trl_grads:
        torch.testing.assert_close(our_grads[name], trl_grads[name], rtol=1e-4, atol=1e-7, msg=name)

    metrics = ours._metrics["train"]
    bonus = expected - inputs["advantages"].double().unsqueeze(1)
    assert metrics["ent_adv/mean_bonus"] == [pytest.approx(((bonus * mask).sum() / mask.sum()).item(), rel=1e-5)]
    shaped_tokens = mask * (inputs["advantages"] != 0).double().unsqueeze(1)
    fraction = ((capped.double() * shaped_tokens).sum() / shaped_tokens.sum()).item()
    assert metrics["ent_adv/capped_fraction"] == [pytest.approx(fraction, rel=1e-6)]

    # The comparison has power: GRPO's own advantages, the bonus without its cap and the cap without |·| each give
    # another loss.
    advantages = inputs["advantages"].double().unsqueeze(1)
    entropy = naive_entropy(trl_trainer.model, inputs)
    others = {
        "unshaped": advantages.expand_as(expected),
        "no_cap": advantages + ALPHA * entropy,
        "no_abs": advantages + torch.minimum(ALPHA * entropy, advantages / KAPPA),
    }
    for name, other in others.items():
        other_loss, _ = loss_and_gradients(trl_trainer, dict(inputs, advantages=other.float()))
        assert abs(other_loss.item() - our_loss.item()) > 1e-4, name


def test_loss_and_gradients_equal_a_float64_loss_written_out(toy_model_path, toy_tokenizer, toy_trainer_of):
    """GRPO's clipped surrogate with TRL's dual clip and the k3 KL (times the ratio: TRL's default
    use_bias_correction_kl), in float64 from a float64 copy of the model, with A' in place of A in both branches of the
    min."""
    epsilon, delta, beta = 0.2, 1.25, 0.04
    ours = toy_trainer_of(
        "ent_adv", ent_adv_alpha=ALPHA, ent_adv_kappa=KAPPA, loss_type="grpo", delta=delta, beta=beta
    )
    inputs = real_batch(ours.model, toy_tokenizer, seed=11)
    our_loss, our_grads = loss_and_gradients(ours, inputs)

    reference = float64_model(toy_model_path)
    entropy = naive_entropy(reference, inputs)  # detached: the entropy only
    log_probs = completion_log_probs(reference, inputs)
    advantages = inputs["advantages"].double().unsqueeze(1)
    shaped_advantages = advantages + torch.minimum(ALPHA * entropy, advantages.abs() / KAPPA)
    ratio = torch.exp(log_probs - inputs["old_per_token_logps"].double())
    surrogate = -torch.minimum(
        torch.clamp(ratio, max=delta) * shaped_advantages,
        torch.clamp(ratio, 1 - epsilon, 1 + epsilon) * shaped_advantages,
    )
    reference_log_ratio = inputs["ref_per_token_logps"].double() - log_probs
    kl = torch.exp(reference_log_ratio) - reference_log_ratio - 1
    mask = inputs["completion_mask"].double()
    loss = (((surrogate + beta * kl * ratio) * mask).sum(-1) / mask.sum(-1)).mean()
    assert (ratio > delta).any() and ((ratio < 1 - epsilon) | (ratio > 1 + epsilon)).any(), "no clip acts"
    assert_step_is_float64(our_loss, our_grads, loss, reference)


# TRL's KL term and two-sided clip, which the registry's check of every method's neutral settings against
# trl.GRPOTrainer leaves out (tests/trainer/test_loss_types.py: every loss type, at β = 0 and without δ; the bare loss
# types are its cells). The metrics are logged before the loss type aggregates anything.
@pytest.mark.parametrize(
    "options", [{"loss_type": "grpo", "beta": 0.04, "delta": 1.2}], ids=lambda options: options["loss_type"]
)
def test_zero_alpha_equals_grpo_trainer(toy_tokenizer, options, toy_trainer_of):
    trl_trainer = toy_trainer_of(TRL, "trl", **options)
    ours = toy_trainer_of("ent_adv", "ours", ent_adv_alpha=0.0, **options)
    inputs = real_batch(trl_trainer.model, toy_tokenizer, seed=5)
    assert_same_step(trl_trainer, ours, inputs)
    assert ours._metrics["train"]["ent_adv/mean_bonus"] == [0.0]
    assert ours._metrics["train"]["ent_adv/capped_fraction"] == [0.0]


# The pair table's piece (tests/compose/test_pairs.py): the per-token advantage.


def pair_shaped_advantages(advantages, log_probs, entropy, s):
    """Entropy-based advantage shaping (arXiv:2506.14758): ``A + min(α·H, |A|/κ)``."""
    return advantages + torch.minimum(s["ent_adv_alpha"] * entropy, advantages.abs() / s["ent_adv_kappa"])


PAIR = PairReference(
    settings=dict(ent_adv_alpha=0.4, ent_adv_kappa=2.0),
    methods={"ent_adv": PairMethod("per-token advantage", token_advantages=pair_shaped_advantages)},
)
