"""CE-GPPO (Su et al., "CE-GPPO: Coordinating Entropy via Gradient-Preserving Clipping Policy Optimization in
Reinforcement Learning", arXiv:2509.20712, eq. 8; the authors' code at github.com/Kwai-Klear/CE-GPPO, commit 10558fe;
docs/ce_gppo.md): the worked example number for number, through the pure function and the trainer's surrogate hook;
the trainer's loss, gradients and metrics against a float64 CE-GPPO loss written out here, on a batch whose old
log-probs put tokens in every branch by construction, for every accepted loss type; the refused loss types and
options; the neutral settings against trl.GRPOTrainer (on-policy; β₁ = β₂ = 0; β₁ = β₂ = 1); the edge cases; bad
values; the on-policy warning. The shared suites (LoRA, trainer API, loss types, bad input, model cards, report
panels, docs, resume) cover it through the registry."""

import math
import re

import pytest
import torch
from _reference.float64_policy import completion_log_probs, float64_model
from _reference.pairs import PairMethod, PairReference
from _support.grpo import (
    build_trainer,
    loss_and_gradients,
    make_grpo_batch,
    naive_log_probs,
    on_policy_warnings,
    toy_config,
)
from _support.parity import assert_same_step

from trl_entropy.core.batch import CompletionBatch
from trl_entropy.core.trl.objectives import PPO_CLIP_LOSS_TYPES
from trl_entropy.methods.ce_gppo import CEGPPOConfig, ce_gppo_branches, ce_gppo_surrogate


# Our trainers run off-policy (two passes per generation batch), the setting CE-GPPO acts in: no on-policy warning.
OFF_POLICY = {"num_iterations": 2}


def reference_per_token_loss(ratio, advantages, epsilon_low, epsilon_high, beta1, beta2, c):
    """The paper's eq. 8, written out as the authors' code computes it (the quotient ``r / sg(r)``), then their dual
    clip ``min(L, −c·A)`` for ``A < 0`` (``c`` None: none). ``ratio`` ``(B, T)``, ``advantages`` ``(B, 1)``."""
    advantages = advantages.expand_as(ratio)
    low = (ratio < 1 - epsilon_low) & (advantages < 0)
    high = (ratio > 1 + epsilon_high) & (advantages > 0)
    loss = -ratio * advantages
    loss = torch.where(low, -beta1 * (1 - epsilon_low) / ratio.detach() * ratio * advantages, loss)
    loss = torch.where(high, -beta2 * (1 + epsilon_high) / ratio.detach() * ratio * advantages, loss)
    if c is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -c * advantages), loss)
    return loss


# ---------------------------------------------------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------------------------------------------------


def test_defaults_are_the_authors_1_5b_script():
    config = toy_config(CEGPPOConfig, **OFF_POLICY)
    assert (config.ce_gppo_beta1, config.ce_gppo_beta2) == (0.5, 1.0)
    assert (config.epsilon, config.epsilon_high, config.delta) == (0.2, None, None)  # ε 0.2 / 0.2; no dual clip
    assert config.loss_type == "dapo"  # TRL's default: the authors' token-mean aggregation
    zero = toy_config(CEGPPOConfig, ce_gppo_beta1=0.0, ce_gppo_beta2=0.0, **OFF_POLICY)  # PPO's gradient
    assert (zero.ce_gppo_beta1, zero.ce_gppo_beta2) == (0.0, 0.0)
    assert toy_config(CEGPPOConfig, delta=10.0, **OFF_POLICY).delta == 10.0  # the authors' c
    assert toy_config(CEGPPOConfig, delta=1.2, **OFF_POLICY).delta == 1.2  # at 1 + ε_high: TRL's meaning still


BAD_VALUES = [
    (name, value) for name in ("ce_gppo_beta1", "ce_gppo_beta2") for value in (-0.1, -1e-12, math.nan, math.inf, True)
] + [("ce_gppo_beta1", "0.5"), ("ce_gppo_beta2", "1")]


@pytest.mark.parametrize("name, value", BAD_VALUES, ids=[f"{n}={v!r}" for n, v in BAD_VALUES])
def test_bad_values_are_refused_by_name(name, value):
    with pytest.raises(ValueError, match=re.escape(f"{name}={value!r} is invalid")):
        toy_config(CEGPPOConfig, **{name: value}, **OFF_POLICY)


@pytest.mark.parametrize("loss_type, reason", [("cispo", "epsilon_max"), ("sapo", "sigmoid gate"), ("vespo", "gamma")])
def test_loss_types_without_the_ppo_clip_are_refused_with_the_reason(loss_type, reason):
    message = rf"CEGPPO does not support loss_type='{loss_type}': .*no PPO clip .*CE-GPPO.*{reason}"
    with pytest.raises(ValueError, match=message):
        toy_config(CEGPPOConfig, loss_type=loss_type, **OFF_POLICY)


@pytest.mark.parametrize(
    "options, message",
    [
        ({"importance_sampling_level": "sequence"}, "importance_sampling_level='sequence' is not supported by CEGPPO"),
        ({"delta": 1.1}, "delta=1.1 is not supported by CEGPPOConfig below 1 + epsilon_high"),
        ({"delta": 1.3, "epsilon_high": 0.4}, "delta=1.3 is not supported"),
        ({"entropy_coef": 0.01}, "CE-GPPO controls entropy itself"),
        ({"use_adaptive_entropy": True}, "use_adaptive_entropy"),
    ],
    ids=["sequence_level", "delta_inside_the_clip", "delta_below_epsilon_high", "entropy_coef", "adaptive_entropy"],
)
def test_unsupported_options_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        toy_config(CEGPPOConfig, **options, **OFF_POLICY)


ON_POLICY = "CE-GPPO with fully on-policy updates"


@pytest.mark.parametrize(
    "options",
    [
        {},  # TRL's defaults: one pass, steps_per_generation = gradient_accumulation_steps
        {"epsilon_high": 0.28},  # a clip range of its own: still one warning, CE-GPPO's
    ],
)
def test_warns_once_at_construction_when_on_policy(tmp_path, toy_model_path, toy_tokenizer, options):
    """The other layouts, on-policy or not, for every method: tests/trainer/test_base.py (the same warning on each
    on-policy one, none off-policy)."""
    messages = on_policy_warnings("ce_gppo", toy_model_path, toy_tokenizer, tmp_path, **options)
    assert len(messages) == 1, messages  # CE-GPPO's own, not also the base's clip warning
    # it names what is inert and the settings that make CE-GPPO act
    assert ON_POLICY in messages[0]
    assert "ce_gppo_beta1 and ce_gppo_beta2 have no effect" in messages[0]
    assert "num_iterations > 1" in messages[0]
    assert "steps_per_generation > gradient_accumulation_steps" in messages[0]


# ---------------------------------------------------------------------------------------------------------------------
# The worked example (docs/ce_gppo.md): ε 0.2/0.2, β₁ 0.5, β₂ 1, c 10, token mean
# ---------------------------------------------------------------------------------------------------------------------

EXAMPLE_ADVANTAGES = [1.0, -1.0, 1.0, -1.0]
EXAMPLE_RATIOS = [1.5, 0.5, 1.1, 12.0]  # high (β₂), low (β₁), inside, above the dual clip c = 10
EXAMPLE_LOSSES = [-1.2, 0.4, -1.1, 10.0]  # −1·1.2·1, −0.5·0.8·(−1), −1.1·1, min(12, 10)
EXAMPLE_LOSS = 2.025  # their mean
EXAMPLE_GRADIENT = [-0.3, 0.1, -0.275, 0.0]  # ∂loss/∂ℓ: −β₂·1.2·A/4, −β₁·0.8·A/4, −r·A/4, 0 (the dual clip binds)


def example_log_probs():
    log_probs = torch.full((1, 4), -1.0, requires_grad=True)
    old_log_probs = log_probs.detach() - torch.tensor([EXAMPLE_RATIOS]).log()
    return log_probs, old_log_probs


def test_worked_example_through_the_pure_function():
    log_probs, old_log_probs = example_log_probs()
    advantages = torch.tensor([EXAMPLE_ADVANTAGES])
    loss, low, high = ce_gppo_surrogate(log_probs - old_log_probs, advantages, 0.2, 0.2, 0.5, 1.0, 10.0)
    torch.testing.assert_close(loss, torch.tensor([EXAMPLE_LOSSES]), rtol=0, atol=1e-6)
    assert low.tolist() == [[False, True, False, False]] and high.tolist() == [[True, False, False, False]]
    total = loss.mean()
    total.backward()
    assert total.item() == pytest.approx(EXAMPLE_LOSS, abs=1e-6)
    torch.testing.assert_close(log_probs.grad, torch.tensor([EXAMPLE_GRADIENT]), rtol=0, atol=1e-6)
    # Per-sequence advantages (B, 1) broadcast over the tokens.
    loss_b1, _, _ = ce_gppo_surrogate(torch.zeros(2, 3), torch.tensor([[1.0], [-1.0]]), 0.2, 0.2, 0.5, 1.0, 10.0)
    torch.testing.assert_close(loss_b1, torch.tensor([[-1.0] * 3, [1.0] * 3]))


@pytest.fixture(scope="module")
def example_trainer(toy_model_path, toy_tokenizer, tmp_path_factory):
    return build_trainer(
        "ce_gppo",
        toy_model_path,
        toy_tokenizer,
        tmp_path_factory.mktemp("ce_gppo"),
        delta=10.0,  # the authors' dual clip c
        **OFF_POLICY,
    )


def test_worked_example_loss_gradient_and_metrics_through_the_trainer(example_trainer):
    log_probs, old_log_probs = example_log_probs()
    batch = CompletionBatch(
        log_probs=log_probs,
        old_log_probs=old_log_probs,
        entropy=torch.ones(1, 4),
        clamped_entropy=None,
        mask=torch.ones(1, 4),
        group_advantages=torch.tensor([EXAMPLE_ADVANTAGES]),
    )
    metrics = example_trainer._metrics["train"]
    metrics.clear()
    assert example_trainer.clip_range() == (0.2, 0.2)
    measured = []
    advantages = example_trainer.token_advantages(batch, measured)
    ratio = torch.exp(batch.log_probs - batch.old_log_probs)
    per_token = example_trainer.surrogate(batch, ratio, advantages, example_trainer.clip_range(), measured)
    example_trainer.record_metrics(batch.mode, measured)
    total = per_token.mean()  # four valid tokens: the token mean
    total.backward()
    assert total.item() == pytest.approx(EXAMPLE_LOSS, abs=1e-6)
    torch.testing.assert_close(per_token, torch.tensor([EXAMPLE_LOSSES]), rtol=0, atol=1e-6, check_dtype=False)
    torch.testing.assert_close(batch.log_probs.grad, torch.tensor([EXAMPLE_GRADIENT]), rtol=0, atol=1e-6)
    assert metrics["ce_gppo/low_fraction"] == [pytest.approx(0.25)]  # token 2
    assert metrics["ce_gppo/high_fraction"] == [pytest.approx(0.25)]  # token 1


# ---------------------------------------------------------------------------------------------------------------------
# The formula: against the written-out reference in float64, and its edge cases
# ---------------------------------------------------------------------------------------------------------------------

BETAS = [(0.5, 1.0), (0.75, 1.0), (0.25, 1.0), (0.0, 0.0), (1.0, 1.0), (2.0, 0.3)]


@pytest.mark.parametrize("beta1, beta2", BETAS)
@pytest.mark.parametrize("c", [None, 3.0])
def test_surrogate_follows_the_formula_in_float64(beta1, beta2, c):
    generator = torch.Generator().manual_seed(0)
    log_ratio = (torch.randn(5, 9, generator=generator, dtype=torch.float64) * 0.8).requires_grad_()
    advantages = torch.randn(5, 1, generator=generator, dtype=torch.float64)
    advantages[2] = 0.0
    loss, low, high = ce_gppo_surrogate(log_ratio, advantages, 0.2, 0.28, beta1, beta2, c)
    (gradient,) = torch.autograd.grad(loss.sum(), log_ratio)
    reference_log_ratio = log_ratio.detach().clone().requires_grad_()
    ratio = torch.exp(reference_log_ratio)
    expected = reference_per_token_loss(ratio, advantages, 0.2, 0.28, beta1, beta2, c)
    (expected_gradient,) = torch.autograd.grad(expected.sum(), reference_log_ratio)
    torch.testing.assert_close(loss, expected, rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(gradient, expected_gradient, rtol=1e-14, atol=1e-14)
    assert low.any() and high.any() and not (low & high).any()
    if c is not None:
        assert ((advantages < 0) & (torch.exp(log_ratio) > c)).any(), "the dual clip must bind somewhere"
    # The gradient with respect to ℓ is the paper's eq. 10: −F·A, F = β₁(1 − ε_low), β₂(1 + ε_high) or r.
    capped = (advantages < 0) & (loss.detach() == -(c or math.inf) * advantages)
    factor = torch.where(low, beta1 * 0.8, torch.where(high, beta2 * 1.28, torch.exp(log_ratio.detach())))
    torch.testing.assert_close(gradient[~capped], (-factor * advantages)[~capped], rtol=1e-14, atol=1e-14)
    assert torch.all(gradient[capped] == 0)


def exact_log_ratio(bound: float, dtype) -> torch.Tensor:
    """A log-ratio whose exponential is exactly ``bound`` in ``dtype`` (the float nearest log(bound) may miss it)."""
    log_ratio = torch.tensor(math.log(bound), dtype=dtype)
    target = torch.tensor(bound, dtype=dtype)
    for _ in range(64):
        ratio = torch.exp(log_ratio)
        if ratio == target:
            return log_ratio
        log_ratio = torch.nextafter(log_ratio, torch.tensor(-math.inf if ratio > target else math.inf, dtype=dtype))
    raise AssertionError(f"no log-ratio gives exactly {bound}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_ratio_exactly_at_a_bound_is_not_clipped(dtype):
    """Strict inequalities: r = 1 − ε_low with A < 0 and r = 1 + ε_high with A > 0 take −r·A (and its gradient)."""
    epsilon_low, epsilon_high = 0.25, 0.5  # bounds 0.75 and 1.5, exact in binary
    log_ratio = torch.stack([exact_log_ratio(0.75, dtype), exact_log_ratio(1.5, dtype)]).unsqueeze(0)
    log_ratio.requires_grad_()
    advantages = torch.tensor([[-2.0, 2.0]], dtype=dtype)
    low, high = ce_gppo_branches(torch.exp(log_ratio), advantages, epsilon_low, epsilon_high)
    assert not low.any() and not high.any()
    loss, low, high = ce_gppo_surrogate(log_ratio, advantages, epsilon_low, epsilon_high, 0.5, 0.3)
    assert not low.any() and not high.any()
    (gradient,) = torch.autograd.grad(loss.sum(), log_ratio)
    torch.testing.assert_close(loss.detach(), torch.tensor([[1.5, -3.0]], dtype=dtype), rtol=0, atol=0)
    torch.testing.assert_close(gradient, torch.tensor([[1.5, -3.0]], dtype=dtype), rtol=0, atol=0)  # −r·A
    # Just beyond each bound: clipped, with β₁ = 0.5 and β₂ = 0.3.
    beyond = (log_ratio.detach() + torch.tensor([[-1e-3, 1e-3]], dtype=dtype)).requires_grad_()
    loss, low, high = ce_gppo_surrogate(beyond, advantages, epsilon_low, epsilon_high, 0.5, 0.3)
    assert low.tolist() == [[True, False]] and high.tolist() == [[False, True]]
    (gradient,) = torch.autograd.grad(loss.sum(), beyond)
    expected = torch.tensor([[0.5 * 0.75 * 2.0, -0.3 * 1.5 * 2.0]], dtype=dtype)
    torch.testing.assert_close(gradient, expected, rtol=1e-6, atol=0)


def test_zero_advantage_gives_zero_loss_and_gradient_at_any_ratio():
    log_ratio = torch.tensor([[-5.0, -0.5, 0.0, 0.3, 3.0]], requires_grad=True)  # ratios from 0.007 to 20
    loss, low, high = ce_gppo_surrogate(log_ratio, torch.zeros(1, 1), 0.2, 0.2, 0.5, 1.0, 10.0)
    loss.sum().backward()
    assert not low.any() and not high.any()
    assert torch.all(loss == 0) and torch.all(log_ratio.grad == 0)


def test_an_underflowing_ratio_keeps_its_bounded_gradient():
    """r = exp(−200) is 0 in float32: the authors' r / sg(r) would give 0/0; the clipped token keeps the value
    −β₁(1 − ε_low)·A and the gradient −β₁(1 − ε_low)·A."""
    log_ratio = torch.tensor([[-200.0, -200.0]], requires_grad=True)
    advantages = torch.tensor([[-2.0, 2.0]])
    loss, low, high = ce_gppo_surrogate(log_ratio, advantages, 0.2, 0.2, 0.5, 1.0, 10.0)
    loss.sum().backward()
    assert low.tolist() == [[True, False]] and not high.any()
    torch.testing.assert_close(loss.detach(), torch.tensor([[0.8, 0.0]]))  # A > 0, r ≈ 0: −r·A
    torch.testing.assert_close(log_ratio.grad, torch.tensor([[0.8, 0.0]]))
    assert torch.isfinite(log_ratio.grad).all()


def test_dual_clip_bounds_the_low_branch_too():
    """As the authors' code: min(L, −c·A) applies to every A < 0 token, so a β₁(1 − ε_low) above c is capped at −c·A
    (with no gradient); on-branch tokens with β₁(1 − ε_low) ≤ c are untouched."""
    log_ratio = torch.log(torch.tensor([[0.5, 0.5]])).requires_grad_()
    advantages = torch.tensor([[-1.0, -1.0]])
    loss, _, _ = ce_gppo_surrogate(log_ratio, advantages, 0.2, 0.2, 5.0, 1.0, 3.0)
    loss.sum().backward()
    torch.testing.assert_close(loss.detach(), torch.tensor([[3.0, 3.0]]))  # 5·0.8 = 4 > c = 3
    assert torch.all(log_ratio.grad == 0)


# ---------------------------------------------------------------------------------------------------------------------
# Trainer: loss, gradients and metrics on a real batch, branches by construction
# ---------------------------------------------------------------------------------------------------------------------

# One advantage per completion and one ratio per token, chosen so that every branch occurs among the valid tokens
# (make_grpo_batch: row 1 has 3 valid tokens, row 2 one) with margins far above rounding, for ε 0.2 / 0.28, c = 10:
# row 0 (A > 0): high, inside, below 1 − ε (not clipped: A > 0), high, inside, high;
# row 1 (A < 0): low, dual clip, inside;  row 2 (A > 0): high;
# row 3 (A < 0): low, low, above 1 + ε (not clipped: A < 0), dual clip, inside, inside.
ADVANTAGES = torch.tensor([0.9, -0.7, 1.3, -1.6])
RATIOS = torch.tensor(
    [
        [1.5, 1.1, 0.5, 2.0, 0.95, 1.4],
        [0.5, 12.0, 1.1, 0.6, 1.5, 14.0],
        [1.6, 0.5, 13.0, 1.0, 1.0, 1.0],
        [0.3, 0.7, 1.5, 15.0, 0.85, 1.25],
    ]
)
EPSILON_LOW, EPSILON_HIGH, C = 0.2, 0.28, 10.0
BETA1, BETA2 = 0.5, 1.0
# The aggregation of each loss type, written out (accumulation 1, one micro-batch per generation): ``m`` the mask.
AGGREGATIONS = {
    "grpo": lambda loss, m, max_length: ((loss * m).sum(-1) / m.sum(-1)).mean(),
    "bnpo": lambda loss, m, max_length: (loss * m).sum() / m.sum(),
    "dr_grpo": lambda loss, m, max_length: (loss * m).sum() / (m.size(0) * max_length),
    "dapo": lambda loss, m, max_length: (loss * m).sum() / m.sum(),  # num_items_in_batch: this batch's tokens
    "luspo": lambda loss, m, max_length: (loss * m).sum(-1).mean(),
}
assert set(AGGREGATIONS) == set(PPO_CLIP_LOSS_TYPES)
# The k3 KL term on two of them (TRL's default use_bias_correction_kl: times the ratio).
KL_BETA = {"grpo": 0.04, "luspo": 0.04}


def constructed_batch(model, tokenizer, seed, ratios=RATIOS):
    """A GRPO micro-batch whose old log-probs are the model's own float64 log-probs minus log(ratios)."""
    inputs = make_grpo_batch(model, len(tokenizer), seed=seed)
    inputs["advantages"] = ADVANTAGES.clone()
    inputs["old_per_token_logps"] = (naive_log_probs(model, inputs) - ratios.double().log()).float()
    return inputs


def float64_loss(model_path, inputs, loss_type, beta1=BETA1, beta2=BETA2, c=C, kl_beta=0.0, max_length=6):
    """CE-GPPO's loss in float64 from a float64 copy of the model, and the copy (its gradients filled)."""
    reference = float64_model(model_path)
    log_probs = completion_log_probs(reference, inputs)
    ratio = torch.exp(log_probs - inputs["old_per_token_logps"].double())
    advantages = inputs["advantages"].double().unsqueeze(1)
    per_token = reference_per_token_loss(ratio, advantages, EPSILON_LOW, EPSILON_HIGH, beta1, beta2, c)
    if kl_beta:
        reference_log_ratio = inputs["ref_per_token_logps"].double() - log_probs
        kl = torch.exp(reference_log_ratio) - reference_log_ratio - 1
        per_token = per_token + kl_beta * kl * ratio
    mask = inputs["completion_mask"].double()
    loss = AGGREGATIONS[loss_type](per_token, mask, max_length)
    loss.backward()
    return loss.detach(), reference, ratio.detach(), mask


def branch_fractions(ratio, mask):
    advantages = ADVANTAGES.double().unsqueeze(1)
    low = ((ratio < 1 - EPSILON_LOW) & (advantages < 0)).double()
    high = ((ratio > 1 + EPSILON_HIGH) & (advantages > 0)).double()
    dual = ((ratio > C) & (advantages < 0)).double()
    return [((x * mask).sum() / mask.sum()).item() for x in (low, high, dual)]


@pytest.mark.parametrize("loss_type", PPO_CLIP_LOSS_TYPES)
def test_loss_gradients_and_metrics_equal_a_float64_loss_written_out(
    toy_model_path, toy_tokenizer, loss_type, toy_trainer_of
):
    kl_beta = KL_BETA.get(loss_type, 0.0)
    ours = toy_trainer_of(
        "ce_gppo",
        loss_type=loss_type,
        epsilon=EPSILON_LOW,
        epsilon_high=EPSILON_HIGH,
        delta=C,
        beta=kl_beta,
        **OFF_POLICY,
    )
    inputs = constructed_batch(ours.model, toy_tokenizer, seed=PPO_CLIP_LOSS_TYPES.index(loss_type))
    our_loss, our_grads = loss_and_gradients(ours, inputs)
    loss, reference, ratio, mask = float64_loss(toy_model_path, inputs, loss_type, kl_beta=kl_beta)
    torch.testing.assert_close(ratio, RATIOS.double(), rtol=1e-5, atol=0)  # the construction holds
    low, high, dual = branch_fractions(ratio, mask)
    assert low > 0 and high > 0 and dual > 0, "every branch must occur among the valid tokens"
    torch.testing.assert_close(our_loss.double(), loss, rtol=1e-5, atol=1e-7)
    assert any(parameter.grad.abs().max() > 0 for parameter in reference.parameters())
    for name, parameter in reference.named_parameters():
        torch.testing.assert_close(our_grads[name].double(), parameter.grad, rtol=1e-3, atol=1e-6, msg=name)
    metrics = ours._metrics["train"]
    assert metrics["ce_gppo/low_fraction"] == [pytest.approx(low, abs=1e-7)]
    assert metrics["ce_gppo/high_fraction"] == [pytest.approx(high, abs=1e-7)]
    assert metrics["clip_ratio/low_mean"] == metrics["ce_gppo/low_fraction"]  # the same tokens TRL counts


NEUTRAL_OPTIONS = {
    "grpo": {"loss_type": "grpo", "beta": 0.04, "delta": C},
    "dapo": {"loss_type": "dapo", "epsilon_high": EPSILON_HIGH},
    "luspo": {"loss_type": "luspo"},
}


@pytest.mark.parametrize("case", NEUTRAL_OPTIONS)
def test_on_policy_equals_grpo_trainer(toy_tokenizer, cached_trl_trainer, case, toy_trainer_of):
    """Every ratio 1 (TRL leaves out the old log-probs): no token is clipped, CE-GPPO is GRPO's loss step."""
    options = NEUTRAL_OPTIONS[case]
    trl = cached_trl_trainer(**options)
    with pytest.warns(UserWarning, match=ON_POLICY):  # and says so
        ours = toy_trainer_of("ce_gppo", "ours", **options)
    inputs = make_grpo_batch(trl.model, len(toy_tokenizer), seed=20, old_noise=None)
    assert_same_step(trl, ours, inputs)
    assert ours._metrics["train"]["ce_gppo/low_fraction"] == [0.0]
    assert ours._metrics["train"]["ce_gppo/high_fraction"] == [0.0]


def ppo_clipped_value(ratio, advantages, mask):
    """PPO's loss on its clipped tokens (a constant in ℓ): −(1 − ε_low)·A below, −(1 + ε_high)·A above; 0 elsewhere."""
    low = (ratio < 1 - EPSILON_LOW) & (advantages < 0)
    high = (ratio > 1 + EPSILON_HIGH) & (advantages > 0)
    value = torch.where(low, -(1 - EPSILON_LOW) * advantages, torch.where(high, -(1 + EPSILON_HIGH) * advantages, 0.0))
    return value * mask


@pytest.mark.parametrize("case", NEUTRAL_OPTIONS)
def test_zero_betas_have_grpo_trainers_gradients_and_unit_betas_its_loss(
    toy_tokenizer, cached_trl_trainer, case, toy_trainer_of
):
    """β₁ = β₂ = 0: PPO's gradient (clipped tokens carry none), but loss 0 where PPO's is its clipped constant.
    β₁ = β₂ = 1: PPO's loss value on every token, but the clipped tokens keep the gradient (1 ± ε)·A."""
    options = {"epsilon": EPSILON_LOW, "epsilon_high": EPSILON_HIGH, **NEUTRAL_OPTIONS[case]}
    trl = cached_trl_trainer(**options)
    inputs = constructed_batch(trl.model, toy_tokenizer, seed=30)
    trl_loss, trl_grads = loss_and_gradients(trl, inputs)
    losses, grads = {}, {}
    for beta in (0.0, 1.0):
        ours = toy_trainer_of(
            "ce_gppo", f"ours_{beta}", ce_gppo_beta1=beta, ce_gppo_beta2=beta, **options, **OFF_POLICY
        )
        losses[beta], grads[beta] = loss_and_gradients(ours, inputs)
    assert set(grads[0.0]) == set(trl_grads) == set(grads[1.0])
    for name in trl_grads:  # LUSPO sums over tokens: an absolute tolerance on the gradient's own scale
        atol = 1e-6 * max(1.0, trl_grads[name].abs().max().item())
        torch.testing.assert_close(grads[0.0][name], trl_grads[name], rtol=1e-4, atol=atol, msg=name)
    torch.testing.assert_close(losses[1.0], trl_loss, rtol=1e-5, atol=1e-7)
    # The loss difference at β = 0 is exactly PPO's clipped constant, aggregated as the loss type aggregates.
    ratio = torch.exp(naive_log_probs(trl.model, inputs) - inputs["old_per_token_logps"].double())
    mask = inputs["completion_mask"].double()
    constant = ppo_clipped_value(ratio, ADVANTAGES.double().unsqueeze(1), mask)
    difference = AGGREGATIONS[options["loss_type"]](constant, mask, 6).item()
    assert abs(difference) > 1e-2, "the clipped tokens must carry a value"
    assert (trl_loss - losses[0.0]).item() == pytest.approx(difference, rel=1e-4)
    # β = 1 keeps a gradient on the clipped tokens: not PPO's.
    assert max((grads[1.0][name] - trl_grads[name]).abs().max().item() for name in trl_grads) > 1e-4


# The pair table's piece (tests/compose/test_pairs.py): the surrogate.


def pair_ce_gppo_surrogate(log_probs, old_log_probs, advantages, mask, s):
    """CE-GPPO (arXiv:2509.20712, eq. 8): the PPO clip, whose clipped tokens keep ``β·(1∓ε)·A`` as gradient through
    ``r / sg(r)``."""
    ratio = torch.exp(log_probs - old_log_probs)
    low, high = 1 - s["epsilon"], 1 + s["epsilon_high"]
    kept = ratio / ratio.detach()
    below = (ratio < low) & (advantages < 0)
    above = (ratio > high) & (advantages > 0)
    return torch.where(
        below,
        -s["ce_gppo_beta1"] * low * kept * advantages,
        torch.where(above, -s["ce_gppo_beta2"] * high * kept * advantages, -ratio * advantages),
    )


PAIR = PairReference(
    settings=dict(ce_gppo_beta1=0.5, ce_gppo_beta2=1.0),
    methods={"ce_gppo": PairMethod("surrogate", surrogate=pair_ce_gppo_surrogate)},
)
